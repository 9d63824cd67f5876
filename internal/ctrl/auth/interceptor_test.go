package auth

import "testing"

// TestRoleFor: reads need a viewer, writes and a workspace's files (its
// transfer artifact) an editor, and AdminService's
// calls an admin, but for the two every token may make; so a viewer told
// what it lacks is told what the call needs, not the next role up.
func TestRoleFor(t *testing.T) {
	for procedure, want := range map[string]Role{
		"/kibotos.ctrl.v1.WorkspaceService/ListWorkspaces":      Viewer,
		"/kibotos.ctrl.v1.WorkspaceService/WatchWorkspace":      Viewer,
		"/kibotos.ctrl.v1.WorkspaceService/CreateWorkspace":     Editor,
		"/kibotos.ctrl.v1.SessionService/IssueSession":          Editor,
		"/kibotos.ctrl.v1.TransferService/GetTransfer":          Viewer,
		"/kibotos.ctrl.v1.TransferService/ReadTransferArtifact": Editor,
		"/kibotos.admin.v1.AdminService/CreateToken":            Admin,
		"/kibotos.admin.v1.AdminService/ListTokens":             Admin,
		"/kibotos.admin.v1.AdminService/ListHosts":              Admin,
		"/kibotos.admin.v1.AdminService/GetCaller":              Viewer,
		"/kibotos.admin.v1.AdminService/ListProjects":           Viewer,
	} {
		if got := RoleFor(procedure); got != want {
			t.Errorf("RoleFor(%s) = %s, want %s", procedure, got, want)
		}
	}
}
