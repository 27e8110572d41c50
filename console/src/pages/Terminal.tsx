import { useEffect, useRef, useState } from "preact/hooks";
import { terminalURL } from "../api";
import { href, termLine, terminalAppend } from "../lib";
import { Badge, Card, ErrorBox } from "../ui";

/** Terminal is an interactive shell under a PTY in a session (or the
 * sandbox), over the gateway's WebSocket. Lines are typed in the input
 * and sent with Enter; the window size follows the output pane. */
export function Terminal({ id, ws }: { id: string; ws: string }) {
  const [screen, setScreen] = useState("");
  const [partial, setPartial] = useState("");
  const [state, setState] = useState("connecting");
  const [err, setErr] = useState<any>(null);
  const [line, setLine] = useState("");
  const sock = useRef<WebSocket | null>(null);
  const pane = useRef<HTMLPreElement>(null);
  const input = useRef<HTMLInputElement>(null);

  const size = () => {
    const el = pane.current;
    if (!el) return { rows: 24, cols: 80 };
    const cw = 8.4;
    const lh = 18;
    return {
      rows: Math.max(5, Math.min(200, Math.floor(el.clientHeight / lh))),
      cols: Math.max(20, Math.min(400, Math.floor(el.clientWidth / cw))),
    };
  };

  useEffect(() => {
    setScreen("");
    setPartial("");
    setErr(null);
    const { rows, cols } = size();
    const s = new WebSocket(terminalURL(id, ws, rows, cols));
    sock.current = s;
    setState("connecting");
    s.onopen = () => {
      setState("connected");
      input.current?.focus();
    };
    s.onclose = () => setState((st) => (st === "exited" ? st : "closed"));
    s.onmessage = (ev) => {
      const m = JSON.parse(ev.data);
      if (m.type === "output") {
        setScreen((sc) => terminalAppend(sc, m.lines ?? []));
        setPartial(termLine(m.partial ?? ""));
      } else if (m.type === "error") {
        setErr(m.error);
      } else if (m.type === "exit") {
        setState("exited");
      }
    };
    let last = `${rows}x${cols}`;
    const ro = new ResizeObserver(() => {
      const z = size();
      const k = `${z.rows}x${z.cols}`;
      if (k !== last && s.readyState === WebSocket.OPEN) {
        last = k;
        s.send(JSON.stringify({ type: "resize", rows: z.rows, cols: z.cols }));
      }
    });
    if (pane.current) ro.observe(pane.current);
    return () => {
      ro.disconnect();
      s.close();
    };
  }, [id, ws]);

  useEffect(() => {
    if (pane.current) pane.current.scrollTop = pane.current.scrollHeight;
  }, [screen, partial]);

  const send = (data: string) => {
    if (sock.current?.readyState === WebSocket.OPEN) sock.current.send(JSON.stringify({ type: "input", data }));
  };

  return (
    <div>
      <div class="page-head">
        <h1>
          <span class="muted">Terminal</span> <span class="mono">{ws || "sandbox (no session: changes publish when the shell ends)"}</span>
        </h1>
        <div class="actions">
          <Badge v={state} />
          <a class="button" href={href({ page: "sandbox", id })}>
            Back to {id.slice(0, 12)}…
          </a>
        </div>
      </div>
      <Card title="Shell">
        <ErrorBox error={err} />
        <pre ref={pane} class="terminal" id="terminal-screen" aria-live="polite" aria-label="Terminal output" tabIndex={0}>
          {screen}
          {screen && "\n"}
          {partial}
        </pre>
        <form
          class="term-input"
          onSubmit={(e) => {
            e.preventDefault();
            send(line + "\n");
            setLine("");
          }}
        >
          <label class="sr" for="terminal-input">
            Command
          </label>
          <input
            ref={input}
            id="terminal-input"
            class="mono"
            value={line}
            autocomplete="off"
            spellcheck={false}
            disabled={state !== "connected"}
            onInput={(e) => setLine((e.target as HTMLInputElement).value)}
            placeholder="type a command, Enter to run"
          />
          <button type="submit" disabled={state !== "connected"}>
            Run
          </button>
          <button type="button" disabled={state !== "connected"} onClick={() => send("exit\n")} title="End the shell">
            Exit
          </button>
        </form>
      </Card>
    </div>
  );
}
