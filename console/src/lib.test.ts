import { describe, expect, it } from "vitest";
import {
  age,
  bytes,
  conflictsOf,
  crFold,
  href,
  parseDiff,
  parseRoute,
  pushBounded,
  rangeText,
  rate,
  sparkline,
  stripAnsi,
  terminalAppend,
  termLine,
} from "./lib";

describe("routes", () => {
  it("parses every page and round-trips through href", () => {
    for (const h of [
      "#/",
      "#/sandbox/eos-1",
      "#/files/eos-1?ws=ws-2&path=a%2Fb.txt&mode=diff",
      "#/files/eos-1?mode=blame",
      "#/terminal/eos-1?ws=ws-2",
      "#/health",
    ]) {
      expect(href(parseRoute(h))).toBe(h);
    }
  });
  it("reads the sign-in code from the fragment", () => {
    expect(parseRoute("#login=abc-_1")).toEqual({ page: "login", code: "abc-_1" });
  });
  it("falls back to the fleet for a bad id or an unknown page", () => {
    expect(parseRoute("#/sandbox/<script>")).toEqual({ page: "fleet" });
    expect(parseRoute("#/nope")).toEqual({ page: "fleet" });
    expect(parseRoute("")).toEqual({ page: "fleet" });
  });
  it("ignores an unknown files mode", () => {
    const r = parseRoute("#/files/eos-1?mode=rm");
    expect(r.page === "files" && r.mode).toBe("browse");
  });
});

describe("sparkline", () => {
  it("scales values into the box, newest on the right", () => {
    expect(sparkline([0, 5, 10], 100, 20)).toBe("0,20 50,10 100,0");
  });
  it("draws a flat line for constant values and nothing for none", () => {
    expect(sparkline([3, 3], 10, 10)).toBe("0,0 10,0");
    expect(sparkline([], 10, 10)).toBe("");
  });
  it("keeps a bounded history", () => {
    let xs: number[] = [];
    for (let i = 0; i < 40; i++) xs = pushBounded(xs, i, 30);
    expect(xs.length).toBe(30);
    expect(xs[0]).toBe(10);
    expect(xs[29]).toBe(39);
  });
});

describe("formatting", () => {
  it("formats sizes and ages", () => {
    expect(bytes(512)).toBe("512 B");
    expect(bytes(1536)).toBe("1.5 KiB");
    expect(bytes(undefined)).toBe("–");
    expect(age(1000, 61000)).toBe("1m");
    expect(age("2026-01-01T00:00:00Z", Date.parse("2026-01-01T02:00:00Z"))).toBe("2h");
    expect(age(undefined)).toBe("–");
  });
  it("renders line ranges", () => {
    expect(rangeText({ start_line: 3, line_count: 3 })).toBe("lines 3–5");
    expect(rangeText({ start_line: 3, line_count: 1 })).toBe("line 3");
    expect(rangeText({ start_line: 7, line_count: 0 })).toBe("at line 7");
  });
  it("computes rates from counters, never negative across a restart", () => {
    expect(rate({ v: 10, t: 0 }, { v: 30, t: 2000 })).toBe(10);
    expect(rate({ v: 30, t: 0 }, { v: 5, t: 2000 })).toBe(0);
    expect(rate(undefined, { v: 5, t: 2000 })).toBe(0);
  });
});

describe("conflicts and diffs", () => {
  it("collects conflicts from a publish record and from a rejection", () => {
    const hunk = { base: { start_line: 1, line_count: 1 }, head: { start_line: 1, line_count: 2 }, ours: { start_line: 1, line_count: 1 } };
    expect(conflictsOf({ conflicts: [{ path: "a.txt", kind: "content", hunks: [hunk] }] })).toEqual([
      { path: "a.txt", kind: "content", message: "", hunks: [hunk] },
    ]);
    expect(conflictsOf({ details: { conflicts: [{ path: "b", reason: "binary" }] } })[0].kind).toBe("binary");
    expect(conflictsOf({})).toEqual([]);
  });
  it("classifies unified diff lines", () => {
    const d = parseDiff("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old\n+new\n same");
    expect(d.map((l) => l.kind)).toEqual(["file", "file", "hunk", "del", "add", "ctx"]);
  });
});

describe("terminal", () => {
  it("strips escape sequences", () => {
    expect(stripAnsi("\x1b[1;32mok\x1b[0m")).toBe("ok");
    expect(stripAnsi("\x1b]0;title\x07$ ")).toBe("$ ");
  });
  it("folds carriage returns like a terminal", () => {
    expect(crFold("$ \r$ ")).toBe("$ ");
    expect(crFold("progress 10%\rprogress 100%")).toBe("progress 100%");
    expect(crFold("abcdef\rXY")).toBe("XYcdef");
    expect(crFold("ok\r")).toBe("ok");
    expect(termLine("\x1b[32m$ \x1b[0m\r\x1b[K$ ")).toBe("$ ");
  });
  it("appends lines and keeps at most max", () => {
    expect(terminalAppend("a", ["b", "c"])).toBe("a\nb\nc");
    expect(terminalAppend("", ["x"])).toBe("x");
    expect(terminalAppend("1\n2\n3", ["4"], 2)).toBe("3\n4");
  });
});
