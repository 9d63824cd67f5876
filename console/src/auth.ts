// Sign-in: the token is checked with a call and kept in session storage;
// the project and role come from AdminService.GetCaller, as any client reads them.
import { Role } from "../../sdk/typescript/gen/kibotos/admin/v1/admin_pb.js";
import { api, apiError, errorText, setToken } from "./api.js";
import { field, h } from "./dom.js";

/** Caller is who the token is: its project and role. */
export interface Caller {
  projectId: string;
  projectName: string;
  operator: boolean;
  /** role is "viewer", "editor" or "admin". */
  role: string;
  tokenId: string;
  tokenName: string;
}

/**
 * canWrite reports whether the caller's role may call the API's writes
 * (every method but Get, List, Watch and Read, and IssueSession, which the
 * terminal and the files need, among them); a viewer's may not.
 */
export function canWrite(c: Caller): boolean {
  return c.role === "editor" || c.role === "admin";
}

/**
 * canChangeBuiltIn reports whether the caller may change the deployment's
 * built-in templates: only an admin of the operator project may; anyone
 * else's change of one is permission_denied.
 */
export function canChangeBuiltIn(c: Caller): boolean {
  return c.operator && c.role === "admin";
}

/** whoami reads the caller with GetCaller, which every role may call. */
export async function whoami(): Promise<Caller> {
  const { project, token } = await api.admin.getCaller({});
  if (!project || !token) throw new Error("the API named no project or token for this token");
  return {
    projectId: project.projectId, projectName: project.name, operator: project.operator,
    role: Role[token.role]?.toLowerCase() ?? String(token.role), tokenId: token.tokenId, tokenName: token.name,
  };
}

/**
 * signInView renders the sign-in form, with why a token is asked for again
 * when notice says; onSignedIn runs once a token works.
 */
export function signInView(main: HTMLElement, onSignedIn: (c: Caller) => void, notice = ""): void {
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
      onSignedIn(await whoami());
    } catch (e) {
      setToken(null);
      const err = document.getElementById("token-error");
      if (err) err.textContent = errorText(apiError(e));
      input.setAttribute("aria-invalid", "true");
      input.focus();
    }
  });
  if (notice) form.append(h("p", { id: "signin-notice", class: "field-error", role: "alert" }, notice));
  main.replaceChildren(form);
  input.focus();
}
