import { useEffect, useState } from "preact/hooks";
import { ApiError, op, OpError } from "../api";
import { useNow, useWatches } from "../hooks";
import { age, bytes, href } from "../lib";
import { Badge, Card, ErrorBox, Loading, Spark } from "../ui";

function CreateForm({ onCreated }: { onCreated: (id: string) => void }) {
  const [images, setImages] = useState<string[]>([]);
  const [image, setImage] = useState("");
  const [root, setRoot] = useState("");
  const [dirs, setDirs] = useState<{ name: string; path: string }[]>([]);
  const [parent, setParent] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const [err, setErr] = useState<ApiError | null>(null);

  useEffect(() => {
    op("list_docker_images")
      .then((r) => {
        const tags: string[] = (r.images ?? []).flatMap((i: any) => i.tags ?? []);
        setImages(tags);
        if (tags.length && !image) setImage(tags[0]);
      })
      .catch((e) => setErr(e.err));
    browse("");
  }, []);

  function browse(path: string) {
    op("list_workspace_directories", path ? { path } : {})
      .then((r) => {
        setDirs(r.directories ?? []);
        setParent(r.parent ?? null);
        if (path) setRoot(path);
      })
      .catch((e) => setErr(e.err));
  }

  async function submit(e: Event) {
    e.preventDefault();
    setBusy(true);
    setErr(null);
    try {
      const r = await op("create_sandbox", { image, workspace_root: root });
      onCreated(r.id);
    } catch (x) {
      setErr(x instanceof OpError ? x.err : { kind: "error", message: String(x) });
    } finally {
      setBusy(false);
    }
  }

  return (
    <form class="create" onSubmit={submit} aria-label="Create a sandbox">
      <label>
        Image
        <select id="create-image" value={image} onChange={(e) => setImage((e.target as HTMLSelectElement).value)}>
          {images.map((t) => (
            <option value={t}>{t}</option>
          ))}
        </select>
      </label>
      <label class="grow">
        Workspace folder
        <input
          id="create-root"
          value={root}
          placeholder="/absolute/path"
          onInput={(e) => setRoot((e.target as HTMLInputElement).value)}
          required
        />
      </label>
      <button id="create-submit" type="submit" disabled={busy || !image || !root}>
        {busy ? "Creating…" : "Create sandbox"}
      </button>
      <div class="dirs" aria-label="Folders">
        {parent != null && (
          <button type="button" class="link" onClick={() => browse(parent)}>
            ..
          </button>
        )}
        {dirs.slice(0, 40).map((d) => (
          <button type="button" class="link" onClick={() => browse(d.path)} title={d.path}>
            {d.name}/
          </button>
        ))}
      </div>
      <ErrorBox error={err} />
    </form>
  );
}

function DestroyButton({ id }: { id: string }) {
  const [armed, setArmed] = useState(false);
  const [busy, setBusy] = useState(false);
  const [err, setErr] = useState<ApiError | null>(null);
  if (busy) return <span class="muted">destroying…</span>;
  return (
    <span>
      <button
        class={armed ? "danger" : ""}
        data-destroy={id}
        aria-label={armed ? `Confirm destroying ${id}` : `Destroy ${id}`}
        onClick={async () => {
          if (!armed) return setArmed(true);
          setBusy(true);
          try {
            await op("destroy_sandbox", { sandbox_id: id });
          } catch (x) {
            setErr((x as OpError).err);
            setBusy(false);
            setArmed(false);
          }
        }}
        onBlur={() => setArmed(false)}
      >
        {armed ? "Confirm destroy" : "Destroy"}
      </button>
      <ErrorBox error={err} />
    </span>
  );
}

export function Fleet() {
  const [snap, list] = useWatches([{ op: "snapshot" }, { op: "list_sandboxes" }]);
  const now = useNow();
  const records: Record<string, any> = {};
  for (const r of list.data?.sandboxes ?? []) records[r.id] = r;
  const snaps: Record<string, any> = {};
  for (const s of snap.data?.sandboxes ?? []) snaps[s.sandbox_id] = s;
  const ids = Array.from(new Set([...Object.keys(records), ...Object.keys(snaps)])).sort();

  return (
    <div>
      <Card title="Create a sandbox" id="create">
        <CreateForm onCreated={(id) => (location.hash = href({ page: "sandbox", id }))} />
      </Card>
      <Card title={`Sandboxes (${ids.length})`} id="fleet">
        <ErrorBox error={snap.error ?? list.error} />
        {!list.data && !list.error && <Loading what="the fleet" />}
        {list.data && ids.length === 0 && <p class="muted">No sandboxes yet.</p>}
        {ids.length > 0 && (
          <div class="table-wrap">
            <table class="fleet cards">
              <thead>
                <tr>
                  <th>Sandbox</th>
                  <th>State</th>
                  <th>Host</th>
                  <th>Sessions</th>
                  <th>CPU</th>
                  <th>Memory</th>
                  <th>Age</th>
                  <th>
                    <span class="sr">Actions</span>
                  </th>
                </tr>
              </thead>
              <tbody>
                {ids.map((id) => {
                  const r = records[id] ?? {};
                  const s = snaps[id] ?? {};
                  const hist: any[] = s.resources?.history ?? [];
                  const d = r.daemon ?? s.daemon_endpoint;
                  const host = r.host ?? (d?.host ? `${d.host}:${d.port}` : "–");
                  return (
                    <tr data-sandbox={id}>
                      <td data-label="Sandbox">
                        <a href={href({ page: "sandbox", id })}>{id}</a>
                        <div class="muted small">{r.image}</div>
                      </td>
                      <td data-label="State">
                        <Badge v={r.state ?? s.lifecycle_state} /> {s.availability && s.availability !== "available" && <Badge v={s.availability} />}
                      </td>
                      <td class="mono small" data-label="Host">{host}</td>
                      <td data-label="Sessions">{(s.workspaces ?? []).length || r.workspace_session_count || 0}</td>
                      <td data-label="CPU">
                        <Spark values={hist.map((h) => h.cpu_percent ?? 0)} label="CPU %" fmt={(n) => `${n.toFixed(1)}%`} />
                      </td>
                      <td data-label="Memory">
                        <Spark values={hist.map((h) => h.memory_bytes ?? 0)} label="Memory" fmt={bytes} />
                      </td>
                      <td data-label="Age">{age(r.created, now)}</td>
                      <td data-label="Actions">
                        <DestroyButton id={id} />
                      </td>
                    </tr>
                  );
                })}
              </tbody>
            </table>
          </div>
        )}
      </Card>
    </div>
  );
}
