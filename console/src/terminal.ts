// A terminal in the page: xterm.js on a shell with a PTY in the guest,
// started through the data plane with the tag "console-terminal". The
// process outlives the page: a reload (or another tab) attaches to it
// again by its tag with ConnectProcess, which replays the output the guest
// kept, so the screen comes back.
import { ConnectError } from "@connectrpc/connect";
import { FitAddon } from "@xterm/addon-fit";
import { Terminal } from "@xterm/xterm";
import "@xterm/xterm/css/xterm.css";
import type { ProcessEvent } from "../../sdk/typescript/gen/kibotos/data/v1/data_pb.js";
import { apiError, errorText, withPlane } from "./api.js";
import { h } from "./dom.js";

/** TAG names the console's shell in each workspace. */
export const TAG = "console-terminal";

const selector = { selector: { case: "tag" as const, value: TAG } };

/** terminalView opens the workspace's shell in body until signal aborts; the shell keeps running. */
export function terminalView(body: HTMLElement, workspaceId: string, signal: AbortSignal): void {
  const status = h("p", { id: "term-status", class: "status", role: "status" });
  const restart = h("button", { type: "button", class: "small", hidden: true }, "Start a new shell");
  const screen = h("div", { id: "terminal", class: "terminal" });
  body.replaceChildren(h("h2", null, "Terminal"), h("div", { class: "toolbar" }, status, restart), screen);
  const term = new Terminal({ cursorBlink: true, fontFamily: "ui-monospace, monospace", fontSize: 14, scrollback: 5000 });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(screen);
  fit.fit();
  const enc = new TextEncoder();
  let input = Promise.resolve();
  // While the terminal draws the output the guest replays, what it would
  // answer (a cursor position report to a shell's ESC[6n) answers queries
  // of the past: sent to the shell, it would arrive as keystrokes, and
  // ash takes it for its cursor's place and erases lines at its next redraw.
  let replaying = false;
  term.onData((d) => {
    if (replaying) return;
    const data = enc.encode(d);
    input = input.then(() => withPlane(workspaceId, (p) => p.proc.sendInput({ process: selector, data }).then(() => undefined)))
      .catch((e) => {
        status.textContent = `input: ${errorText(apiError(e))}`;
      });
  });
  term.onResize(({ cols, rows }) => {
    withPlane(workspaceId, (p) => p.proc.resizeTerminal({ process: selector, size: { cols, rows } }))
      .catch((e) => (status.textContent = `resize: ${errorText(apiError(e))}`));
  });
  const onResize = () => fit.fit();
  window.addEventListener("resize", onResize);
  signal.addEventListener("abort", () => {
    window.removeEventListener("resize", onResize);
    term.dispose();
  });

  async function run(start: boolean) {
    restart.hidden = true;
    try {
      const events = await withPlane(workspaceId, async (p) => {
        if (!start) {
          const { processes } = await p.proc.listProcesses({}, { signal });
          start = !processes.some((x) => x.tag === TAG && !x.exited);
        }
        const stream = start
          ? p.proc.startProcess({ args: ["sh"], env: { TERM: "xterm-256color" }, tag: TAG, stdin: true, pty: { cols: term.cols, rows: term.rows } }, { signal })
          : p.proc.connectProcess({ process: selector }, { signal });
        const it = stream[Symbol.asyncIterator]();
        const first = await it.next(); // a refused session fails here, and withPlane retries
        return { first, it };
      });
      status.textContent = start ? "started a shell" : "attached to the running shell";
      if (!start) await withPlane(workspaceId, (p) => p.proc.resizeTerminal({ process: selector, size: { cols: term.cols, rows: term.rows } }));
      term.focus();
      // The first output of an attach is the replay (the guest sends what
      // it holds at once, up to 32 KiB a message), after the started event
      // that names the process.
      let replay = !start;
      for (let r = events.first; !r.done; r = await events.it.next()) {
        show(r.value, replay, start);
        if (r.value.event.case !== "started") replay = false;
      }
    } catch (e) {
      if (signal.aborted) return;
      status.textContent = errorText(apiError(ConnectError.from(e)));
      restart.textContent = "Reconnect"; // to the shell if it still runs
      restart.hidden = false;
    }
  }
  function show(ev: ProcessEvent, replay: boolean, started: boolean) {
    switch (ev.event.case) {
      case "started":
        status.textContent = started
          ? `shell pid ${ev.event.value.pid} (tag ${TAG})`
          : `attached to the running shell, pid ${ev.event.value.pid} (tag ${TAG})`;
        break;
      case "pty":
      case "stdout":
      case "stderr":
        if (replay) {
          replaying = true;
          term.write(ev.event.value, () => (replaying = false));
        } else {
          term.write(ev.event.value);
        }
        break;
      case "exited": {
        const x = ev.event.value;
        status.textContent = `the shell ended: ${x.signal || `exit code ${x.exitCode}`}`;
        restart.textContent = "Start a new shell";
        restart.hidden = false;
        break;
      }
    }
  }
  // The shell may still run (a broken connection): attach to it then,
  // else start one.
  restart.addEventListener("click", () => {
    term.reset();
    run(false);
  });
  run(false);
}
