import { defineConfig } from "vite";

// The bundle is committed and embedded by the gateway (console/embed.go), so
// its names are fixed (no content hashes) and `make console` reproduces it
// byte for byte; CI diffs a fresh build against the committed one.
export default defineConfig({
  base: "/",
  esbuild: { jsx: "automatic", jsxImportSource: "preact", legalComments: "none" },
  build: {
    outDir: "dist",
    emptyOutDir: true,
    target: "es2022",
    sourcemap: false,
    modulePreload: false,
    cssCodeSplit: false,
    rollupOptions: {
      output: {
        entryFileNames: "assets/app.js",
        chunkFileNames: "assets/[name].js",
        assetFileNames: "assets/[name][extname]",
      },
    },
  },
  test: { environment: "node", include: ["src/**/*.test.ts"] },
} as any);
