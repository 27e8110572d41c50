import { useWatches } from "../hooks";
import { bytes, href, parseDiff, Route } from "../lib";
import { Card, ErrorBox, Loading } from "../ui";

type FilesRoute = Extract<Route, { page: "files" }>;

function join(dir: string, name: string): string {
  return dir && dir !== "." ? `${dir.replace(/\/$/, "")}/${name}` : name;
}

function parentOf(p: string): string {
  const i = p.replace(/\/$/, "").lastIndexOf("/");
  return i < 0 ? "" : p.slice(0, i);
}

function Tabs({ r }: { r: FilesRoute }) {
  const tab = (mode: FilesRoute["mode"], label: string, enabled = true) =>
    enabled ? (
      <a class={`tab${r.mode === mode ? " active" : ""}`} aria-current={r.mode === mode ? "page" : undefined} href={href({ ...r, mode })}>
        {label}
      </a>
    ) : null;
  return (
    <nav class="tabs" aria-label="File views">
      {tab("browse", "Browse")}
      {tab("diff", "Unpublished changes", !!r.ws)}
      {tab("blame", "Blame (published)", !r.ws)}
    </nav>
  );
}

function Browser({ r, dir, file }: { r: FilesRoute; dir: string; file: string }) {
  const wsArgs = r.ws ? { workspace_session_id: r.ws } : {};
  const [list, read, blame] = useWatches([
    { op: "file_list", sandbox_id: r.id, args: { path: dir || ".", ...wsArgs } },
    file ? { op: "file_read", sandbox_id: r.id, args: { path: file, ...wsArgs } } : null,
    file && r.mode === "blame" ? { op: "file_blame", sandbox_id: r.id, args: { path: file } } : null,
  ]);
  const lines = String(read.data?.content ?? "").split("\n");
  const owners: string[] = [];
  for (const rg of blame.data?.ranges ?? []) for (let i = 0; i < rg.line_count; i++) owners[rg.start_line - 1 + i] = rg.owner;
  return (
    <div class="files">
      <div class="tree">
        <div class="small muted mono">/{dir}</div>
        <ErrorBox error={list.error} />
        <ul>
          {dir && (
            <li>
              <a href={href({ ...r, path: parentOf(dir) ? parentOf(dir) + "/" : "" })}>..</a>
            </li>
          )}
          {(list.data?.entries ?? []).map((e: any) => {
            const p = join(dir, e.name);
            return (
              <li data-entry={p}>
                <a href={href({ ...r, path: e.kind === "directory" ? p + "/" : p })}>
                  {e.name}
                  {e.kind === "directory" ? "/" : ""}
                </a>{" "}
                {e.kind === "file" && <span class="muted small">{bytes(e.size)}</span>}
              </li>
            );
          })}
        </ul>
      </div>
      <div class="viewer">
        {!file && <p class="muted">Pick a file.</p>}
        {file && (
          <>
            <div class="mono small">{file}</div>
            <ErrorBox error={read.error ?? blame.error} />
            {!read.data && !read.error && <Loading what={file} />}
            {read.data && (
              <table class="code" aria-label={`Contents of ${file}`}>
                <tbody>
                  {lines.map((l, i) => (
                    <tr>
                      <td class="ln">{i + 1}</td>
                      {r.mode === "blame" && <td class="owner small">{owners[i] ?? ""}</td>}
                      <td class="src">{l}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            )}
          </>
        )}
      </div>
    </div>
  );
}

function Diff({ r }: { r: FilesRoute }) {
  const [d] = useWatches([{ op: "diff_workspace_session", sandbox_id: r.id, args: { workspace_session_id: r.ws } }]);
  return (
    <div>
      <ErrorBox error={d.error} />
      {!d.data && !d.error && <Loading what="the diff" />}
      {d.data && (d.data.paths ?? []).length === 0 && <p class="muted">No unpublished changes.</p>}
      {d.data && (
        <>
          <ul class="small">
            {(d.data.paths ?? []).map((p: any) => (
              <li>
                <code>{p.path}</code> <span class="muted">{p.status}</span>
              </li>
            ))}
          </ul>
          <pre class="diff" aria-label="Unified diff">
            {parseDiff(d.data.diff ?? "").map((l) => (
              <div class={`d-${l.kind}`}>{l.text || " "}</div>
            ))}
          </pre>
        </>
      )}
    </div>
  );
}

function SessionPicker({ r }: { r: FilesRoute }) {
  const [sessions] = useWatches([{ op: "list_workspace_sessions", sandbox_id: r.id }]);
  const list: any[] = sessions.data?.workspace_sessions ?? [];
  return (
    <label class="picker">
      View{" "}
      <select
        id="files-session"
        value={r.ws}
        onChange={(e) => {
          const ws = (e.target as HTMLSelectElement).value;
          location.hash = href({ ...r, ws, mode: !ws && r.mode === "diff" ? "browse" : ws && r.mode === "blame" ? "browse" : r.mode });
        }}
      >
        <option value="">published head</option>
        {list
          .filter((w) => !w.implicit)
          .map((w) => (
            <option value={w.workspace_session_id}>
              {w.workspace_session_id}
              {w.agent ? ` (${w.agent})` : ""}
            </option>
          ))}
        {r.ws && !list.some((w) => w.workspace_session_id === r.ws) && <option value={r.ws}>{r.ws}</option>}
      </select>
    </label>
  );
}

export function Files({ r }: { r: FilesRoute }) {
  const isDir = r.path === "" || r.path.endsWith("/");
  const dir = isDir ? r.path.replace(/\/$/, "") : parentOf(r.path);
  const file = isDir ? "" : r.path;
  return (
    <div>
      <div class="page-head">
        <h1>
          <span class="muted">Files</span> <span class="mono">{r.ws || "published head"}</span>
        </h1>
        <div class="actions">
          <a class="button" href={href({ page: "sandbox", id: r.id })}>
            Back to {r.id.slice(0, 12)}…
          </a>
          {r.ws && (
            <a class="button" href={href({ page: "terminal", id: r.id, ws: r.ws })}>
              Terminal
            </a>
          )}
        </div>
      </div>
      <div class="files-bar">
        <Tabs r={r} />
        <SessionPicker r={r} />
      </div>
      <Card title={r.mode === "diff" ? "Unpublished changes" : r.mode === "blame" ? "Blame (who published each line)" : "Browse"}>
        {r.mode === "diff" && r.ws ? <Diff r={r} /> : <Browser r={r} dir={dir} file={file} />}
      </Card>
    </div>
  );
}
