import { useEffect, useRef, useState } from "preact/hooks";
import { useWatches } from "../hooks";
import { href, pushBounded, rate } from "../lib";
import { Badge, Card, ErrorBox, Loading, Spark } from "../ui";

function Check({ name, c }: { name: string; c: any }) {
  return (
    <div class="check" data-check={name}>
      <strong>{name}</strong> <Badge v={c?.status} />{" "}
      <span class="muted small">
        {c?.latency_ms != null ? `${Number(c.latency_ms).toFixed(1)} ms` : ""} {c?.version ?? ""} {c?.error ?? ""}
      </span>
    </div>
  );
}

export function Health() {
  const [h] = useWatches([{ op: "health" }]);
  const prev = useRef<{ v: number; t: number } | undefined>(undefined);
  const [opsRate, setOpsRate] = useState<number[]>([]);
  const d = h.data;
  useEffect(() => {
    if (!d?.metrics) return;
    const cur = { v: Number(d.metrics.operations_total ?? 0), t: Number(d.now_unix_ms ?? Date.now()) };
    if (prev.current) setOpsRate((xs) => pushBounded(xs, rate(prev.current, cur)));
    prev.current = cur;
  }, [d]);
  const ops = Object.entries<any>(d?.metrics?.operations ?? {}).sort((a, b) => b[1].count - a[1].count);
  const pubs = Object.entries<number>(d?.metrics?.publishes ?? {});
  return (
    <div>
      <div class="page-head">
        <h1>Health</h1>
        <div class="actions">{d && <Badge v={d.status} />}</div>
      </div>
      <ErrorBox error={h.error} />
      {!d && !h.error && <Loading what="health" />}
      {d && (
        <div class="grid">
          <Card title="Services" id="services">
            <Check name="temporal" c={d.temporal} />
            <Check name="docker" c={d.docker} />
            <h3>Daemons</h3>
            {(d.sandboxes ?? []).length === 0 && <p class="muted">No sandboxes.</p>}
            <ul>
              {(d.sandboxes ?? []).map((s: any) => (
                <li data-daemon={s.sandbox_id}>
                  <a class="mono small" href={href({ page: "sandbox", id: s.sandbox_id })}>
                    {s.sandbox_id}
                  </a>{" "}
                  <Badge v={s.daemon} /> <span class="muted small">{s.latency_ms != null ? `${Number(s.latency_ms).toFixed(1)} ms` : s.state}</span>
                </li>
              ))}
            </ul>
          </Card>
          <Card title="Operations" id="ops">
            <p>
              <Spark values={opsRate} label="operations per second" fmt={(n) => `${n.toFixed(1)} ops/s`} />{" "}
              <span class="muted small">{d.metrics?.operations_total ?? 0} since start</span>
            </p>
            <h3>Publish outcomes</h3>
            {pubs.length === 0 && <p class="muted">No publishes yet.</p>}
            <ul class="inline">
              {pubs.map(([k, v]) => (
                <li>
                  <Badge v={k} /> {v}
                </li>
              ))}
            </ul>
            <h3>Latency by operation</h3>
            <div class="table-wrap">
              <table>
                <thead>
                  <tr>
                    <th>operation</th>
                    <th>calls</th>
                    <th>errors</th>
                    <th>mean</th>
                  </tr>
                </thead>
                <tbody>
                  {ops.slice(0, 15).map(([name, s]) => (
                    <tr>
                      <td class="mono small">{name}</td>
                      <td>{s.count}</td>
                      <td>{s.errors}</td>
                      <td>{s.count ? `${((s.sum_seconds / s.count) * 1000).toFixed(1)} ms` : "–"}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
          </Card>
        </div>
      )}
    </div>
  );
}
