// Builds the web UI's assets into flight/web/static (served by `ticktable serve`; not
// committed): our page, script and style from src/, and Perspective's browser builds.
// Nothing is fetched at run time: the page works offline.
//
// Two sources, one Perspective version (5.5.1):
// - npm (web/node_modules, pinned by package-lock.json): the client (`websocket()`,
//   `worker()`) and the in-browser engine's WebAssembly, in the layout their modules expect
//   (the client finds the server's .wasm at ../../../server/dist/wasm/);
// - perspective-python's wheel (pyproject.toml pins it): `<perspective-viewer>` with its
//   datagrid and chart plugins (viewer-charts: Y Bar, Y Line, X/Y Scatter, Heatmap,
//   Treemap, ...), one ES module and its stylesheet. Perspective 5 publishes its chart
//   plugin on no registry (the d3fc plugin stopped at 4.4.1, which 5's viewer cannot load),
//   so the build takes the bundle the wheel ships for its notebook widget.
// The wheel is found with $PYTHON, else the checkout's .venv/bin/python, else python3.
import {execFileSync} from "node:child_process";
import {cpSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync} from "node:fs";
import {dirname, join} from "node:path";
import {fileURLToPath} from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "..", "flight", "web", "static");
const vendor = join(out, "vendor", "@perspective-dev");
const parts = {
  client: ["dist/cdn", "dist/wasm"],
  server: ["dist/wasm"],
};

function wheelBundle() {
  const venv = join(here, "..", ".venv", "bin", "python");
  const python = process.env.PYTHON || (existsSync(venv) ? venv : "python3");
  const script = "import importlib.metadata as m, importlib.util as u, pathlib\n" +
    "spec = u.find_spec('perspective')\n" +
    "root = pathlib.Path(spec.submodule_search_locations[0]) if spec else None\n" +
    "print(m.version('perspective-python') if root else '')\n" +
    "print(root / 'widget' / 'static' if root else '')\n";
  let lines;
  try {
    lines = execFileSync(python, ["-c", script], {encoding: "utf8"}).split("\n");
  } catch (e) {
    throw new Error(`${python} could not be run (${e.message.split("\n")[0]}): set PYTHON ` +
                    `to the Python that has ticktable installed (make web does)`);
  }
  const [version, dir] = lines;
  if (!version) throw new Error(`perspective-python is not installed for ${python}: ` +
                                `pip install -e . (make web does), or set PYTHON`);
  const npmVersion = JSON.parse(readFileSync(
    join(here, "node_modules", "@perspective-dev", "client", "package.json"), "utf8")).version;
  if (version !== npmVersion) {
    throw new Error(`perspective-python ${version} (${python}) and @perspective-dev/client ` +
                    `${npmVersion} (web/package-lock.json) differ: pin both to one version`);
  }
  return {version, dir};
}

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
const wheel = wheelBundle();
const viewer = join(out, "vendor", "perspective-viewer");
mkdirSync(viewer, {recursive: true});
for (const ext of ["js", "css"]) {
  cpSync(join(wheel.dir, `perspective-anywidget.${ext}`), join(viewer, `perspective-viewer.${ext}`));
}
writeFileSync(join(viewer, "VERSION"), `${wheel.version} (perspective-python's widget bundle)\n`);
cpSync(join(here, "src"), out, {recursive: true});
writeFileSync(join(out, "BUILT"), "built by web/build.mjs from web/src, web/node_modules and " +
              "perspective-python's wheel\n");
console.log(`web assets built in ${out} (Perspective ${wheel.version})`);
