import { useEffect, useState } from "preact/hooks";
import { ApiError, View, watch } from "./api";

export type Watched<T = any> = { data: T | null; error: ApiError | null };

/** useWatches follows read-only views live over one stream; a null view
 * is not watched (its entry stays empty). */
export function useWatches(views: (View | null)[]): Watched[] {
  const empty = () => views.map(() => ({ data: null, error: null }));
  const [state, setState] = useState<Watched[]>(empty);
  const key = JSON.stringify(views);
  useEffect(() => {
    setState(empty());
    const live = views.map((v, i) => [v, i] as const).filter(([v]) => v !== null) as [View, number][];
    if (live.length === 0) return;
    return watch(
      live.map(([v]) => v),
      (j, result, error) =>
        setState((st) => {
          const next = st.slice();
          const i = live[j][1];
          next[i] = error ? { data: next[i]?.data ?? null, error } : { data: result, error: null };
          return next;
        }),
    );
  }, [key]);
  return views.map((_, i) => state[i] ?? { data: null, error: null });
}

/** useNow ticks every few seconds, for ages. */
export function useNow(ms = 5000): number {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    const t = setInterval(() => setNow(Date.now()), ms);
    return () => clearInterval(t);
  }, [ms]);
  return now;
}
