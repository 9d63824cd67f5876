package dataplane

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestAccountsFollowTheFiles: a lookup answers from what the passwd and
// group files hold now: a user appended, a file replaced by a rename with
// the same size, and a group membership added are each seen by the next
// lookup; what a caller does to an answer changes no later one.
func TestAccountsFollowTheFiles(t *testing.T) {
	dir := t.TempDir()
	a := &Accounts{PasswdPath: filepath.Join(dir, "passwd"), GroupPath: filepath.Join(dir, "group")}
	write := func(path, content string) {
		t.Helper()
		tmp := path + ".new"
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	appendTo := func(path, line string) {
		t.Helper()
		f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(line); err != nil {
			t.Fatal(err)
		}
	}
	write(a.PasswdPath, "root:x:0:0:root:/root:/bin/sh\n")
	write(a.GroupPath, "root:x:0:\n")
	if _, err := a.Lookup("alice"); !errors.Is(err, errUnknownUser) {
		t.Fatalf("alice before she is added: %v", err)
	}
	appendTo(a.PasswdPath, "alice:x:1000:1000::/home/alice:/bin/sh\n")
	u, err := a.Lookup("alice")
	if err != nil || u.UID != 1000 || u.Home != "/home/alice" {
		t.Fatalf("alice once added: %+v, %v", u, err)
	}
	u.Groups = append(u.Groups, 4242)
	u.Home = "/elsewhere"
	write(a.PasswdPath, "root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000::/home/alic2:/bin/sh\n")
	if u, err := a.Lookup("alice"); err != nil || u.Home != "/home/alic2" || !slices.Equal(u.Groups, []uint32{1000}) {
		t.Fatalf("alice after the file was replaced: %+v, %v", u, err)
	}
	appendTo(a.GroupPath, "docker:x:999:alice\n")
	if u, err := a.Lookup("alice"); err != nil || !slices.Equal(u.Groups, []uint32{1000, 999}) {
		t.Fatalf("alice after joining a group: %+v, %v", u, err)
	}
}
