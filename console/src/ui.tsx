import { ComponentChildren } from "preact";
import { ApiError } from "./api";
import { sparkline } from "./lib";

export function ErrorBox({ error }: { error: ApiError | null | undefined }) {
  if (!error) return null;
  return (
    <div class="error" role="alert">
      <strong>{error.kind}</strong>: {error.message}
    </div>
  );
}

export function Spark({ values, label, fmt }: { values: number[]; label: string; fmt: (n: number) => string }) {
  const last = values.length ? values[values.length - 1] : undefined;
  return (
    <span class="spark" title={label}>
      <svg width="80" height="20" viewBox="-1 -1 82 22" role="img" aria-label={`${label}: ${last == null ? "no samples" : fmt(last)}`}>
        <polyline points={sparkline(values, 80, 20)} />
      </svg>
      <span class="spark-val">{last == null ? "–" : fmt(last)}</span>
    </span>
  );
}

export function Badge({ v }: { v: string | undefined }) {
  const s = String(v ?? "unknown");
  return <span class={`badge b-${s.replace(/[^a-z_]/gi, "")}`}>{s}</span>;
}

export function Card({ title, children, id }: { title: string; children: ComponentChildren; id?: string }) {
  return (
    <section class="card" id={id} aria-labelledby={id ? id + "-h" : undefined}>
      <h2 id={id ? id + "-h" : undefined}>{title}</h2>
      {children}
    </section>
  );
}

export function Loading({ what }: { what: string }) {
  return <p class="muted">Loading {what}…</p>;
}
