// Files of a workspace through the data plane: browse a directory, upload
// (a picker or drag and drop, with progress), download, rename, delete.
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import { FileType, type FileInfo } from "../../sdk/typescript/gen/kibotos/data/v1/data_pb.js";
import { apiError, errorText, withPlane } from "./api.js";
import { bytes, confirmed, field, foreign, h, setError } from "./dom.js";
import { getFile, putFile } from "./filebytes.js";
import { visible } from "./text.js";

function join(dir: string, name: string): string {
  return dir.endsWith("/") ? dir + name : `${dir}/${name}`;
}

function parent(dir: string): string {
  const p = dir.replace(/\/+$/, "").replace(/\/[^/]*$/, "");
  return p || "/";
}

/** filesView renders the file browser of the workspace into body. */
export function filesView(body: HTMLElement, workspaceId: string, signal: AbortSignal): void {
  const dir = h("input", { id: "files-dir", value: sessionStorage.getItem(`kibotos.dir.${workspaceId}`) ?? "/tmp" });
  const picker = h("input", { id: "files-upload", type: "file", multiple: true });
  const drop = h("div", { class: "drop", tabindex: "0", role: "button", "aria-describedby": "files-upload-hint" },
    "Drop files here to upload them into the directory, or ", h("label", { for: "files-upload", class: "link" }, "choose files"), picker);
  const progress = h("ul", { class: "progress", "aria-live": "polite" });
  const tbody = h("tbody");
  // shown is the directory the table lists: what its rows and uploads act
  // on, whatever the field says meanwhile.
  let shown = "";
  const caption = h("caption", null, "");
  const form = h("form", { class: "toolbar", "aria-label": "Directory" }, field("Directory", dir), h("button", { type: "submit" }, "Open"),
    h("button", { type: "button", onclick: () => open(parent(shown || dir.value)) }, "Up"));
  body.replaceChildren(h("h2", null, "Files"), form,
    h("small", { id: "files-upload-hint" }, "Uploads replace a file of the same name."), drop, progress,
    h("p", { id: "files-error", class: "field-error", role: "alert" }),
    h("div", { class: "scroll" }, h("table", { class: "list", "aria-label": "Files" }, caption,
      h("thead", null, h("tr", null, ...["Name", "Size", "Mode", "Owner", "Modified", "Actions"].map((c) => h("th", { scope: "col" }, c)))), tbody)));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    open(dir.value);
  });

  async function open(path: string) {
    setError("files-dir", "");
    try {
      const { entries } = await withPlane(workspaceId, (p) => p.files.listDirectory({ path, depth: 1 }, { signal }));
      shown = dir.value = path;
      caption.textContent = `Contents of ${visible(path)}`;
      sessionStorage.setItem(`kibotos.dir.${workspaceId}`, path);
      tbody.replaceChildren(...entries.map(row));
    } catch (e) {
      if (signal.aborted) return;
      setError("files-dir", `${visible(path)}: ${errorText(apiError(e))}`);
      if (shown) dir.value = shown; // the table still lists it
    }
  }
  const reload = () => open(shown);

  function row(f: FileInfo): HTMLTableRowElement {
    const isDir = f.type === FileType.DIRECTORY;
    // A guest names its files: each name (and link target) is shown
    // escaped and isolated, so that no name passes for another one
    // ("\u202Etxt.terces" for secret.txt) or turns the text around it.
    const shownName = visible(f.name);
    const name = isDir
      ? h("a", { href: "#", onclick: (ev: Event) => { ev.preventDefault(); open(join(shown, f.name)); } }, foreign(f.name), "/")
      : h("span", null, foreign(f.name), ...(f.type === FileType.SYMLINK ? [" → ", foreign(f.symlinkTarget)] : []));
    const acts = h("td", { class: "actions" });
    const run = (label: string, call: () => Promise<unknown>) =>
      h("button", {
        type: "button", class: "small", "aria-label": `${label} ${shownName}`,
        onclick: async () => {
          setError("files", "");
          try {
            await call();
          } catch (e) {
            setError("files", `${label} ${shownName}: ${errorText(apiError(e))}`);
          }
        },
      }, label);
    if (!isDir) acts.append(run("Download", () => download(f)));
    acts.append(run("Rename", async () => renameForm(acts, f)));
    const path = join(shown, f.name);
    // A second press deletes, a directory with everything in it.
    acts.append(confirmed("Delete", isDir ? `${visible(path)} and all it holds` : visible(path), async () => {
      await withPlane(workspaceId, (p) => p.files.deleteFile({ path, recursive: isDir }));
      await reload();
    }, (e) => setError("files", `Delete ${shownName}: ${errorText(apiError(e))}`)));
    return h("tr", null, h("td", null, name), h("td", null, isDir ? "" : bytes(f.size)),
      h("td", null, `0${f.mode.toString(8)}`), h("td", null, `${f.owner}:${f.group}`),
      h("td", null, f.modifiedAt ? timestampDate(f.modifiedAt).toISOString().replace("T", " ").slice(0, 19) : ""), acts);
  }

  // Each Rename form has ids of its own, numbered: ids made from the
  // names would be the same for two names that differ only in characters
  // an id leaves out ("a b", "a_b"), and the warning of one form would
  // show under the other while its second Save replaced the file unseen.
  let renames = 0;

  function renameForm(cell: HTMLElement, f: FileInfo) {
    const id = `rename-${++renames}`;
    const input = h("input", { id, value: f.name });
    const form = h("form", { class: "inline" }, field(`New name of ${visible(f.name)}`, input), h("button", { type: "submit", class: "small" }, "Save"));
    // A name that is taken is replaced only when Save is pressed again
    // for it.
    let replacing = "";
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      setError(id, "");
      const destination = join(shown, input.value);
      try {
        if (input.value !== f.name && replacing !== destination) {
          const taken = await withPlane(workspaceId, (p) => p.files.inspectFile({ path: destination })).then(() => true, (e) => {
            if (ConnectError.from(e).code !== Code.NotFound) throw e;
            return false;
          });
          if (taken) {
            replacing = destination;
            setError(id, `${visible(input.value)} exists: press Save again to replace it`);
            return;
          }
        }
        await withPlane(workspaceId, (p) => p.files.moveFile({ source: join(shown, f.name), destination }));
        await reload();
      } catch (e) {
        setError(id, errorText(apiError(e)));
      }
    });
    cell.replaceChildren(form);
    input.focus();
    input.select();
  }

  async function download(f: FileInfo) {
    const blob = await withPlane(workspaceId, (p) => getFile(p, join(shown, f.name), signal));
    const url = URL.createObjectURL(blob);
    const a = h("a", { href: url, download: f.name });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10_000);
  }

  async function send(files: FileList | File[]) {
    if (!shown) {
      setError("files", "open a directory to upload into first");
      return;
    }
    const into = shown;
    for (const file of Array.from(files)) {
      const bar = h("progress", { max: String(file.size || 1), value: "0", "aria-label": `Uploading ${visible(file.name)}` });
      const item = h("li", null, foreign(file.name), " ", bar);
      progress.append(item);
      const path = join(into, file.name);
      // The guest writes the file only once the whole body arrived: a cut
      // upload changes nothing.
      try {
        await withPlane(workspaceId, (p) => putFile(p, path, file, (sent) => (bar.value = Math.min(sent, file.size)), signal));
        bar.value = file.size || 1;
        item.append(" uploaded");
      } catch (e) {
        item.append(` failed: ${errorText(apiError(e))}`);
      }
    }
    await reload();
  }
  picker.addEventListener("change", () => picker.files && send(picker.files));
  drop.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" || ev.key === " ") {
      ev.preventDefault();
      picker.click();
    }
  });
  drop.addEventListener("dragover", (ev) => {
    ev.preventDefault();
    drop.classList.add("over");
  });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (ev) => {
    ev.preventDefault();
    drop.classList.remove("over");
    if (ev.dataTransfer?.files.length) send(ev.dataTransfer.files);
  });
  open(dir.value);
}
