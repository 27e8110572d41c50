import { useEffect, useRef, useState } from "preact/hooks";
import { commandStream, eventStream, op } from "../api";
import { useNow, useWatches } from "../hooks";
import { age, bytes, conflictsOf, href, Hunk, rangeText } from "../lib";
import { Badge, Card, ErrorBox, Loading } from "../ui";

type Cmd = { id: string; ws: string; command: string; started?: string };

/** LiveCommand shows one command's output as it is printed (SSE). */
function LiveCommand({ sandbox, cmd }: { sandbox: string; cmd: Cmd }) {
  const [lines, setLines] = useState<string[]>([]);
  const [exit, setExit] = useState<any>(null);
  const pre = useRef<HTMLPreElement>(null);
  useEffect(
    () =>
      commandStream(
        sandbox,
        cmd.id,
        (l) => setLines((xs) => (xs.length > 500 ? [...xs.slice(-500), l.text] : [...xs, l.text])),
        setExit,
      ),
    [sandbox, cmd.id],
  );
  useEffect(() => {
    if (pre.current) pre.current.scrollTop = pre.current.scrollHeight;
  }, [lines.length]);
  return (
    <div class="command" data-command={cmd.id}>
      <div class="command-head">
        <code>{cmd.command}</code>{" "}
        <span class="muted small">
          {cmd.id} {cmd.ws && <>in {cmd.ws}</>}
        </span>{" "}
        {exit ? <Badge v={`${exit.status}`} /> : <Badge v="running" />}
      </div>
      <pre ref={pre} class="output" aria-live="polite" aria-label={`Output of ${cmd.command}`}>
        {lines.join("\n")}
      </pre>
    </div>
  );
}

function HunkTable({ path, kind, hunks }: { path: string; kind: string; hunks: Hunk[] }) {
  return (
    <div class="conflict" data-conflict-path={path}>
      <div>
        <code>{path}</code> <Badge v={kind} />
      </div>
      {hunks.length > 0 && (
        <table class="hunks">
          <thead>
            <tr>
              <th>base</th>
              <th>head (published)</th>
              <th>ours (this session)</th>
            </tr>
          </thead>
          <tbody>
            {hunks.map((h) => (
              <tr>
                <td>{rangeText(h.base)}</td>
                <td>{rangeText(h.head)}</td>
                <td>{rangeText(h.ours)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </div>
  );
}

/** Conflicts renders a rejected publish: the paths the record names and,
 * while the session is still there, their line ranges from check_publish. */
function Conflicts({ sandbox, rec, live, head }: { sandbox: string; rec: any; live: boolean; head: number }) {
  const [detail, setDetail] = useState<any>(null);
  useEffect(() => {
    if (!live) return;
    op("check_publish", { workspace_session_id: rec.workspace_session_id }, { sandbox_id: sandbox })
      .then(setDetail)
      .catch(() => setDetail(null));
  }, [sandbox, rec.txid, live, head]);
  const withHunks = detail && detail.clean === false ? conflictsOf(detail) : [];
  const byPath: Record<string, Hunk[]> = {};
  for (const c of withHunks) byPath[c.path] = c.hunks;
  return (
    <div class="conflicts">
      {conflictsOf(rec).map((c) => (
        <HunkTable path={c.path} kind={c.kind} hunks={byPath[c.path] ?? []} />
      ))}
      {live && (
        <p class="muted small">
          Line ranges from a dry run of the session against the current head.{" "}
          <a href={href({ page: "files", id: sandbox, ws: rec.workspace_session_id, path: "", mode: "diff" })}>See its diff</a>
        </p>
      )}
    </div>
  );
}

function Events({ sandbox }: { sandbox: string }) {
  const [evs, setEvs] = useState<any[]>([]);
  useEffect(() => {
    setEvs([]);
    return eventStream(sandbox, (e) => setEvs((xs) => [e, ...xs].slice(0, 40)));
  }, [sandbox]);
  return (
    <ul class="events" aria-live="off">
      {evs.map((e) => (
        <li>
          <span class="muted small mono">{String(e.ts ?? "").slice(11, 19)}</span> <code>{e.name}</code>{" "}
          <span class="small muted">{summarize(e.attrs)}</span>
        </li>
      ))}
    </ul>
  );
}

function summarize(a: Record<string, unknown> | undefined): string {
  if (!a) return "";
  return Object.entries(a)
    .filter(([, v]) => typeof v !== "object")
    .slice(0, 4)
    .map(([k, v]) => `${k}=${v}`)
    .join(" ");
}

export function Sandbox({ id }: { id: string }) {
  const [snap, info, stack, pubs, wfs] = useWatches([
    { op: "snapshot", sandbox_id: id },
    { op: "inspect_sandbox", sandbox_id: id },
    { op: "layerstack", sandbox_id: id },
    { op: "publish_history", sandbox_id: id, args: { limit: 50 } },
    { op: "workflows", sandbox_id: id, args: { limit: 50 } },
  ]);
  const now = useNow();
  const [cmds, setCmds] = useState<Cmd[]>([]);

  const workspaces: any[] = snap.data?.workspaces ?? [];
  useEffect(() => {
    const running: Cmd[] = workspaces.flatMap((w) =>
      (w.active_namespace_executions ?? []).map((x: any) => ({
        id: x.namespace_execution_id,
        ws: w.implicit ? "" : w.workspace_id,
        command: x.command,
        started: x.started,
      })),
    );
    setCmds((old) => {
      const seen = new Set(old.map((c) => c.id));
      const add = running.filter((c) => !seen.has(c.id));
      return add.length ? [...add, ...old].slice(0, 3) : old; // at most 3 streams: a browser has 6 connections per host
    });
  }, [snap.data]);

  const liveSessions = new Set(workspaces.map((w) => w.workspace_id));
  const headVersion = stack.data?.manifest_version ?? 0;
  const rec = info.data ?? {};

  return (
    <div>
      <div class="page-head">
        <h1>
          <span class="muted">Sandbox</span> <span class="mono">{id}</span>
        </h1>
        <div class="actions">
          <Badge v={rec.state ?? snap.data?.lifecycle_state} />
          <a class="button" href={href({ page: "files", id, ws: "", path: "", mode: "browse" })}>
            Files (published head)
          </a>
          <a class="button" href={href({ page: "terminal", id, ws: "" })}>
            Terminal
          </a>
        </div>
      </div>
      <ErrorBox error={snap.error ?? info.error} />
      <p class="muted small">
        {rec.image} · workspace {rec.workspace_root} · daemon {rec.daemon ? `${rec.daemon.host}:${rec.daemon.port}` : "–"} · created{" "}
        {age(rec.created, now)} ago
      </p>
      <div class="grid">
        <Card title={`Sessions (${workspaces.filter((w) => !w.implicit).length})`} id="sessions">
          {!snap.data && !snap.error && <Loading what="sessions" />}
          {snap.data && workspaces.length === 0 && <p class="muted">No sessions.</p>}
          {workspaces.length > 0 && (
            <div class="table-wrap">
              <table class="cards">
                <thead>
                  <tr>
                    <th>Session</th>
                    <th>Agent</th>
                    <th>State</th>
                    <th>Age</th>
                    <th>Files changed</th>
                    <th>Commands</th>
                    <th>
                      <span class="sr">Links</span>
                    </th>
                  </tr>
                </thead>
                <tbody>
                  {workspaces.map((w) => (
                    <tr data-session={w.workspace_id}>
                      <td class="mono" data-label="Session">{w.workspace_id}</td>
                      <td data-label="Agent">{w.agent || <span class="muted">–</span>}</td>
                      <td data-label="State">
                        <Badge v={w.lifecycle_state} />
                      </td>
                      <td data-label="Age">{age(w.created, now)}</td>
                      <td data-label="Files changed">
                        {w.resources?.upper_entries ?? "–"} <span class="muted small">({bytes(w.resources?.upper_bytes)})</span>
                      </td>
                      <td data-label="Commands">{(w.active_namespace_executions ?? []).length}</td>
                      <td class="links" data-label="Links">
                        <a href={href({ page: "files", id, ws: w.workspace_id, path: "", mode: "browse" })}>files</a>{" "}
                        <a href={href({ page: "files", id, ws: w.workspace_id, path: "", mode: "diff" })}>diff</a>{" "}
                        <a href={href({ page: "terminal", id, ws: w.workspace_id })}>terminal</a>
                      </td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
          )}
        </Card>
        <Card title="Commands" id="commands">
          {cmds.length === 0 && <p class="muted">No command has run since this page opened.</p>}
          {cmds.map((c) => (
            <LiveCommand key={c.id} sandbox={id} cmd={c} />
          ))}
        </Card>
        <Card title="Layer stack" id="layers">
          <ErrorBox error={stack.error} />
          {!stack.data && !stack.error && <Loading what="the layer stack" />}
          {stack.data && (
            <>
              <p class="muted small">
                head v{stack.data.manifest_version} · {stack.data.layer_count} layers · {bytes(stack.data.total_bytes)}
              </p>
              <ol class="timeline">
                {(stack.data.layers ?? []).map((l: any) => (
                  <li class={`layer k-${l.kind}`} data-layer={l.layer_id}>
                    <div>
                      <Badge v={l.kind} /> <strong>{l.agent || (l.kind === "base" ? "base import" : "–")}</strong>{" "}
                      <span class="muted small">{age(l.created, now)} ago</span>
                    </div>
                    <div class="small mono">
                      {l.layer_id} · {l.entries} entries · {bytes(l.bytes)}
                    </div>
                    {(l.booked_by ?? []).length > 0 && <div class="small muted">by {(l.booked_by ?? []).join(", ")}</div>}
                  </li>
                ))}
              </ol>
            </>
          )}
        </Card>
        <Card title="Publish history" id="publishes">
          <ErrorBox error={pubs.error} />
          {pubs.data && (pubs.data.publishes ?? []).length === 0 && <p class="muted">Nothing published yet.</p>}
          <ul class="publishes">
            {(pubs.data?.publishes ?? []).map((p: any) => (
              <li data-publish={p.txid} data-outcome={p.outcome}>
                <div>
                  <Badge v={p.outcome} /> <strong>{p.agent || p.workspace_session_id || p.source}</strong>{" "}
                  <span class="muted small">
                    {age(p.time, now)} ago · {p.path_count} path{p.path_count === 1 ? "" : "s"}
                    {p.layer_id ? ` · ${p.layer_id}` : ""}
                  </span>
                </div>
                <div class="small mono">{(p.paths ?? []).slice(0, 8).join(" ")}</div>
                {p.outcome === "conflict" && (
                  <Conflicts sandbox={id} rec={p} live={liveSessions.has(p.workspace_session_id)} head={headVersion} />
                )}
              </li>
            ))}
          </ul>
        </Card>
        <Card title="Workflows" id="workflows">
          <ErrorBox error={wfs.error} />
          <ul class="workflows">
            {(wfs.data?.workflows ?? []).map((w: any) => (
              <li>
                <Badge v={w.status} /> <span class="small">{String(w.type).replace(/^eos\./, "")}</span>{" "}
                {w.ui_url ? (
                  <a class="mono small" href={w.ui_url} target="_blank" rel="noopener noreferrer">
                    {w.workflow_id}
                  </a>
                ) : (
                  <span class="mono small" title="start the gateway with --temporal-ui for links">
                    {w.workflow_id}
                  </span>
                )}
              </li>
            ))}
          </ul>
        </Card>
        <Card title="Daemon events" id="events">
          <Events sandbox={id} />
        </Card>
      </div>
    </div>
  );
}
