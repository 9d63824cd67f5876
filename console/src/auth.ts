// Sign-in: the token is checked with a call and kept in session storage;
// the project and role come from AdminService, as any client reads them.
import { ConnectError, Code } from "@connectrpc/connect";
import { Role } from "../../sdk/typescript/gen/kibotos/admin/v1/admin_pb.js";
import { api, apiError, errorText, setToken } from "./api.js";
import { field, h } from "./dom.js";

/** Caller is who the token is: its project, and its role where the API says it. */
export interface Caller {
  projectId: string;
  projectName: string;
  operator: boolean;
  /** role is "admin", "editor" or "viewer" when known, else "editor or viewer". */
  role: string;
  tokenId: string;
}

/**
 * whoami reads the caller: ListProjects gives every token its own project
 * (and an operator admin every project, the operator's among them);
 * ListTokens, which only admins may call, names the token's role. A token
 * is "<token id>.<secret>", so its ID is known without a call.
 */
export async function whoami(token: string): Promise<Caller> {
  const { projects } = await api.admin.listProjects({});
  const p = projects.length === 1 ? projects[0] : projects.find((x) => x.operator);
  if (!p) throw new Error("the API named no project for this token");
  const tokenId = token.split(".")[0];
  let role = "editor or viewer";
  try {
    const { tokens } = await api.admin.listTokens({ projectId: p.projectId });
    const t = tokens.find((x) => x.tokenId === tokenId);
    role = t ? Role[t.role].toLowerCase() : "admin";
  } catch (e) {
    if (ConnectError.from(e).code !== Code.PermissionDenied) throw e;
  }
  return { projectId: p.projectId, projectName: p.name, operator: p.operator, role, tokenId };
}

/** signInView renders the sign-in form; onSignedIn runs once a token works. */
export function signInView(main: HTMLElement, onSignedIn: (c: Caller) => void): void {
  const input = h("input", { id: "token", type: "password", autocomplete: "off", required: true, spellcheck: "false" });
  const form = h("form", { class: "card signin", "aria-labelledby": "signin-title" },
    h("h1", { id: "signin-title" }, "Sign in"),
    field("API token", input, "The token is kept in this tab's session storage until you sign out or close the tab."),
    h("button", { type: "submit" }, "Sign in"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const t = input.value.trim();
    setToken(t);
    try {
      onSignedIn(await whoami(t));
    } catch (e) {
      setToken(null);
      const err = document.getElementById("token-error");
      if (err) err.textContent = errorText(apiError(e));
      input.setAttribute("aria-invalid", "true");
      input.focus();
    }
  });
  main.replaceChildren(form);
  input.focus();
}
