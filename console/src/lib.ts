// Pure helpers of the console's pages (unit-tested in lib.test.ts).

/** Route is where the hash says we are. */
export type Route =
  | { page: "fleet" }
  | { page: "sandbox"; id: string }
  | { page: "files"; id: string; ws: string; path: string; mode: "browse" | "diff" | "blame" }
  | { page: "terminal"; id: string; ws: string }
  | { page: "health" }
  | { page: "login"; code: string };

const ID = /^[A-Za-z0-9._:-]{1,128}$/;

export function parseRoute(hash: string): Route {
  const h = hash.replace(/^#/, "");
  if (h.startsWith("login=")) return { page: "login", code: decodeURIComponent(h.slice(6)) };
  const [path, query = ""] = h.split("?");
  const q = new URLSearchParams(query);
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const id = parts[1] ?? "";
  if (parts[0] === "sandbox" && ID.test(id)) return { page: "sandbox", id };
  if (parts[0] === "files" && ID.test(id)) {
    const mode = q.get("mode");
    return {
      page: "files",
      id,
      ws: q.get("ws") ?? "",
      path: q.get("path") ?? "",
      mode: mode === "diff" || mode === "blame" ? mode : "browse",
    };
  }
  if (parts[0] === "terminal" && ID.test(id)) return { page: "terminal", id, ws: q.get("ws") ?? "" };
  if (parts[0] === "health") return { page: "health" };
  return { page: "fleet" };
}

export function href(r: Route): string {
  switch (r.page) {
    case "sandbox":
      return `#/sandbox/${encodeURIComponent(r.id)}`;
    case "files": {
      const q = new URLSearchParams();
      if (r.ws) q.set("ws", r.ws);
      if (r.path) q.set("path", r.path);
      if (r.mode !== "browse") q.set("mode", r.mode);
      const s = q.toString();
      return `#/files/${encodeURIComponent(r.id)}${s ? "?" + s : ""}`;
    }
    case "terminal":
      return `#/terminal/${encodeURIComponent(r.id)}${r.ws ? "?ws=" + encodeURIComponent(r.ws) : ""}`;
    case "health":
      return "#/health";
    default:
      return "#/";
  }
}

/** sparkline is an SVG polyline's points for values in a w x h box. */
export function sparkline(values: number[], w: number, h: number): string {
  if (values.length === 0) return "";
  const max = Math.max(...values);
  const min = Math.min(...values, 0);
  const span = max - min || 1;
  const step = values.length > 1 ? w / (values.length - 1) : 0;
  return values
    .map((v, i) => `${round(i * step)},${round(h - ((v - min) / span) * h)}`)
    .join(" ");
}

function round(n: number): number {
  return Math.round(n * 10) / 10;
}

/** pushBounded appends v, keeping the last n values. */
export function pushBounded(xs: number[] | undefined, v: number, n = 30): number[] {
  const out = [...(xs ?? []), v];
  return out.length > n ? out.slice(out.length - n) : out;
}

export function bytes(n: number | undefined | null): string {
  if (n == null || !isFinite(n)) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let x = n;
  while (Math.abs(x) >= 1024 && i < u.length - 1) {
    x /= 1024;
    i++;
  }
  return `${i === 0 ? x : x.toFixed(1)} ${u[i]}`;
}

/** age is a short "how long ago" of a time (ISO string or unix ms). */
export function age(t: string | number | undefined, now = Date.now()): string {
  if (t == null || t === "") return "–";
  const ms = typeof t === "number" ? t : Date.parse(t);
  if (!isFinite(ms)) return "–";
  const s = Math.max(0, Math.round((now - ms) / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

/** stripAnsi removes terminal escape sequences a PTY prints. */
export function stripAnsi(s: string): string {
  // CSI ... final byte, OSC ... BEL/ST, and lone two-byte escapes.
  return s
    .replace(/\x1b\[[0-?]*[ -/]*[@-~]/g, "")
    .replace(/\x1b\][^\x07\x1b]*(\x07|\x1b\\)/g, "")
    .replace(/\x1b[@-Z\\-_]/g, "");
}

/** crFold applies carriage returns the way a terminal does: text after a
 * "\r" overwrites the line from its start. */
export function crFold(s: string): string {
  let line = "";
  for (const seg of s.split("\r")) line = seg + line.slice(seg.length);
  return line;
}

/** termLine is one PTY line as the screen shows it. */
export function termLine(s: string): string {
  return crFold(stripAnsi(s));
}

export type LineRange = { start_line: number; line_count: number };
export type Hunk = { base: LineRange; head: LineRange; ours: LineRange };

/** rangeText renders a line range ("lines 3–5", "at line 3" when empty). */
export function rangeText(r: LineRange | undefined): string {
  if (!r) return "–";
  if (r.line_count <= 0) return `at line ${r.start_line}`;
  if (r.line_count === 1) return `line ${r.start_line}`;
  return `lines ${r.start_line}–${r.start_line + r.line_count - 1}`;
}

/** conflictsOf collects the conflicting paths a publish record or a
 * rejection carries, with their hunks. */
export function conflictsOf(rec: any): { path: string; kind: string; message: string; hunks: Hunk[] }[] {
  const list: any[] = rec?.conflicts ?? rec?.details?.conflicts ?? rec?.publish_conflicts ?? [];
  return list.map((c) => ({
    path: String(c.path ?? ""),
    kind: String(c.kind ?? c.reason ?? ""),
    message: String(c.message ?? ""),
    hunks: Array.isArray(c.hunks) ? c.hunks : [],
  }));
}

export type DiffLine = { kind: "add" | "del" | "ctx" | "hunk" | "file"; text: string };

/** parseDiff classifies the lines of a unified diff. */
export function parseDiff(patch: string): DiffLine[] {
  if (!patch) return [];
  return patch.split("\n").map((text) => {
    if (text.startsWith("+++") || text.startsWith("---") || text.startsWith("diff ")) return { kind: "file", text };
    if (text.startsWith("@@")) return { kind: "hunk", text };
    if (text.startsWith("+")) return { kind: "add", text };
    if (text.startsWith("-")) return { kind: "del", text };
    return { kind: "ctx", text };
  });
}

/** rate is the per-second rate between two counter readings. */
export function rate(prev: { v: number; t: number } | undefined, cur: { v: number; t: number }): number {
  if (!prev || cur.t <= prev.t || cur.v < prev.v) return 0;
  return ((cur.v - prev.v) * 1000) / (cur.t - prev.t);
}

/** terminalAppend folds a terminal output frame into the screen text. */
export function terminalAppend(done: string, lines: string[], max = 2000): string {
  if (lines.length === 0) return done;
  const all = (done ? done.split("\n") : []).concat(lines.map(termLine));
  return all.slice(Math.max(0, all.length - max)).join("\n");
}
