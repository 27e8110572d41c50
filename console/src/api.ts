// The console's side of the gateway: sign-in, operations (POST /v1/ops/<op>
// with the session cookie and the CSRF header), live views (SSE) and the
// terminal WebSocket. Every call names an operation of the catalog.

export type ApiError = { kind: string; message: string; details?: Record<string, unknown> };

export class OpError extends Error {
  constructor(public err: ApiError, public status: number) {
    super(`${err.kind}: ${err.message}`);
  }
}

let csrf = "";

export function csrfToken(): string {
  return csrf;
}

/** signIn spends a one-time code; the gateway sets the cookie. */
export async function signIn(code: string): Promise<void> {
  const r = await fetch("/console/session", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ code }),
    credentials: "same-origin",
  });
  const j = await r.json();
  if (!r.ok) throw new OpError(j.error, r.status);
  csrf = j.csrf;
}

/** resume picks up an existing session (a reloaded page). */
export async function resume(): Promise<boolean> {
  const r = await fetch("/console/session", { credentials: "same-origin" });
  if (!r.ok) return false;
  csrf = (await r.json()).csrf;
  return true;
}

export async function signOut(): Promise<void> {
  await fetch("/console/session", { method: "DELETE", headers: { "X-EOS-CSRF": csrf }, credentials: "same-origin" });
  csrf = "";
}

export type Scope = { sandbox_id?: string };

/** op runs one catalog operation. */
export async function op<T = any>(name: string, args: Record<string, unknown> = {}, scope: Scope = {}): Promise<T> {
  const body: Record<string, unknown> = { args };
  if (scope.sandbox_id) body.scope = { kind: "sandbox", sandbox_id: scope.sandbox_id };
  const r = await fetch(`/v1/ops/${encodeURIComponent(name)}`, {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-EOS-CSRF": csrf },
    body: JSON.stringify(body),
    credentials: "same-origin",
  });
  const j = await r.json();
  if (!r.ok || j.error) throw new OpError(j.error ?? { kind: "http_" + r.status, message: r.statusText }, r.status);
  return j as T;
}

export type Unwatch = () => void;

export type View = { op: string; sandbox_id?: string; args?: Record<string, unknown> };

/** watch streams read-only views over one connection (a browser has six
 * per host): each view's result when it changed, live. */
export function watch(views: View[], onView: (i: number, result: any, error: ApiError | null) => void): Unwatch {
  const q = new URLSearchParams({ csrf });
  for (const v of views) q.append("v", JSON.stringify(v));
  const es = new EventSource(`/console/watch?${q}`);
  es.addEventListener("view", (e) => {
    const m = JSON.parse((e as MessageEvent).data);
    onView(m.i, m.result ?? null, m.error ?? null);
  });
  return () => es.close();
}

/** commandStream follows one command's output lines, then its result. */
export function commandStream(
  sandboxID: string,
  cmdID: string,
  onLine: (l: { offset: number; text: string; stream?: string }) => void,
  onExit: (out: any) => void,
): Unwatch {
  const q = new URLSearchParams({ csrf });
  const es = new EventSource(`/v1/sandboxes/${encodeURIComponent(sandboxID)}/commands/${encodeURIComponent(cmdID)}/stream?${q}`);
  es.addEventListener("line", (e) => onLine(JSON.parse((e as MessageEvent).data)));
  es.addEventListener("exit", (e) => {
    onExit(JSON.parse((e as MessageEvent).data));
    es.close();
  });
  return () => es.close();
}

/** eventStream follows the sandbox daemon's events. */
export function eventStream(sandboxID: string, onEvent: (ev: any) => void): Unwatch {
  const q = new URLSearchParams({ csrf, last_n: "30" });
  const es = new EventSource(`/v1/sandboxes/${encodeURIComponent(sandboxID)}/events/stream?${q}`);
  es.addEventListener("event", (e) => onEvent(JSON.parse((e as MessageEvent).data)));
  return () => es.close();
}

export function terminalURL(sandboxID: string, ws: string, rows: number, cols: number): string {
  const q = new URLSearchParams({ sandbox_id: sandboxID, rows: String(rows), cols: String(cols), csrf });
  if (ws) q.set("workspace_session_id", ws);
  return `ws://${location.host}/console/terminal?${q}`;
}
