import { useEffect, useState } from "preact/hooks";
import { ApiError, watch } from "./api";

/** useWatch follows a read-only view live (SSE): the latest result or error. */
export function useWatch<T = any>(
  name: string | null,
  opts: { sandbox_id?: string; args?: Record<string, unknown> } = {},
): { data: T | null; error: ApiError | null } {
  const [data, setData] = useState<T | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  const key = JSON.stringify([name, opts]);
  useEffect(() => {
    setData(null);
    setError(null);
    if (!name) return;
    return watch(
      name,
      opts,
      (v) => {
        setData(v);
        setError(null);
      },
      setError,
    );
  }, [key]);
  return { data, error };
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
