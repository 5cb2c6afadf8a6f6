// Builds the web UI's assets into flight/web/static (served by `ticktable serve`; not
// committed): our page, script and style from src/, and Perspective's browser builds
// (ES modules, WebAssembly, themes) from node_modules, in the layout their modules
// expect (the client finds the server's .wasm at ../../../server/dist/wasm/). Nothing is
// fetched at run time: the page works offline.
import {cpSync, existsSync, mkdirSync, rmSync, writeFileSync} from "node:fs";
import {dirname, join} from "node:path";
import {fileURLToPath} from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "..", "flight", "web", "static");
const vendor = join(out, "vendor", "@perspective-dev");
const parts = {
  client: ["dist/cdn", "dist/wasm"],
  server: ["dist/wasm"],
  viewer: ["dist/cdn", "dist/wasm", "dist/css"],
  "viewer-datagrid": ["dist/cdn"],
};

rmSync(out, {recursive: true, force: true});
mkdirSync(vendor, {recursive: true});
for (const [pkg, dirs] of Object.entries(parts)) {
  const root = join(here, "node_modules", "@perspective-dev", pkg);
  if (!existsSync(root)) throw new Error(`${root} is missing: run npm ci in web/ first`);
  for (const d of dirs) {
    cpSync(join(root, d), join(vendor, pkg, d), {
      recursive: true,
      filter: (src) => !src.endsWith(".map") && !src.endsWith(".d.ts"),
    });
  }
  cpSync(join(root, "package.json"), join(vendor, pkg, "package.json"));
}
cpSync(join(here, "src"), out, {recursive: true});
writeFileSync(join(out, "BUILT"), "built by web/build.mjs from web/src and web/node_modules\n");
console.log(`web assets built in ${out}`);
