package dataplane

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Accounts reads the guest's users and groups from its passwd and group
// files. A lookup's answer is kept until either file changes (another
// inode, size, modification or change time), so users added in the guest
// count at once while a process start does not parse both files again.
type Accounts struct {
	// PasswdPath and GroupPath default to /etc/passwd and /etc/group.
	PasswdPath string
	GroupPath  string

	mu     sync.Mutex
	files  [2]fileVersion   // of the passwd and group files, when lookup was filled
	lookup map[string]*User // name → the answer of Lookup
}

// fileVersion tells one content of a file from another without reading
// it; a missing file is its zero value.
type fileVersion struct {
	dev, ino     uint64
	size         int64
	mtime, ctime syscall.Timespec
}

func versionOf(path string) fileVersion {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return fileVersion{}
	}
	return fileVersion{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
}

// User is an account of the guest.
type User struct {
	Name  string
	UID   uint32
	GID   uint32
	Home  string
	Shell string
	// Groups are the supplementary groups: the primary group and every
	// group that lists the user as a member.
	Groups []uint32
}

// errUnknownUser is returned for a name not in the passwd file.
var errUnknownUser = errors.New("unknown user")

func (a *Accounts) passwdPath() string {
	if a == nil || a.PasswdPath == "" {
		return "/etc/passwd"
	}
	return a.PasswdPath
}

func (a *Accounts) groupPath() string {
	if a == nil || a.GroupPath == "" {
		return "/etc/group"
	}
	return a.GroupPath
}

// Lookup returns the user named name; the empty name is root (uid 0, even
// when the passwd file has no root entry). It returns an error wrapping
// errUnknownUser for a name the passwd file lacks. The User is the
// caller's.
func (a *Accounts) Lookup(name string) (*User, error) {
	if a == nil {
		return a.read(name)
	}
	files := [2]fileVersion{versionOf(a.passwdPath()), versionOf(a.groupPath())}
	a.mu.Lock()
	u, ok := a.lookup[name]
	if ok && a.files != files {
		clear(a.lookup)
		ok = false
	}
	a.files = files
	a.mu.Unlock()
	if !ok {
		var err error
		if u, err = a.read(name); err != nil {
			return nil, err
		}
		a.mu.Lock()
		if a.files == files {
			if a.lookup == nil {
				a.lookup = map[string]*User{}
			}
			a.lookup[name] = u
		}
		a.mu.Unlock()
	}
	c := *u
	c.Groups = slices.Clone(u.Groups)
	return &c, nil
}

// read looks name up in the files.
func (a *Accounts) read(name string) (*User, error) {
	var u *User
	err := scanColon(a.passwdPath(), 7, func(f []string) bool {
		if name == "" && f[2] == "0" || name != "" && f[0] == name {
			uid, err1 := strconv.ParseUint(f[2], 10, 32)
			gid, err2 := strconv.ParseUint(f[3], 10, 32)
			if err1 != nil || err2 != nil {
				return true
			}
			u = &User{Name: f[0], UID: uint32(uid), GID: uint32(gid), Home: f[5], Shell: f[6]}
			return false
		}
		return true
	})
	if err != nil && !(name == "" && errors.Is(err, os.ErrNotExist)) {
		return nil, err
	}
	if u == nil {
		if name != "" {
			return nil, fmt.Errorf("%w %q", errUnknownUser, name)
		}
		u = &User{Name: "root", Home: "/root", Shell: "/bin/sh"}
	}
	if u.Home == "" {
		u.Home = "/"
	}
	u.Groups = []uint32{u.GID}
	err = scanColon(a.groupPath(), 4, func(f []string) bool {
		if !slices.Contains(strings.Split(f[3], ","), u.Name) {
			return true
		}
		if gid, err := strconv.ParseUint(f[2], 10, 32); err == nil && !slices.Contains(u.Groups, uint32(gid)) {
			u.Groups = append(u.Groups, uint32(gid))
		}
		return true
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return u, nil
}

// idNames maps uids and gids to names, for FileInfo.owner and group.
type idNames struct {
	users  map[uint32]string
	groups map[uint32]string
}

// names reads the id → name maps; a missing or unreadable file leaves its
// map empty, so ids show as numbers.
func (a *Accounts) names() *idNames {
	n := &idNames{users: map[uint32]string{}, groups: map[uint32]string{}}
	load := func(path string, m map[uint32]string) {
		scanColon(path, 3, func(f []string) bool {
			if id, err := strconv.ParseUint(f[2], 10, 32); err == nil {
				if _, dup := m[uint32(id)]; !dup {
					m[uint32(id)] = f[0]
				}
			}
			return true
		})
	}
	load(a.passwdPath(), n.users)
	load(a.groupPath(), n.groups)
	return n
}

func (n *idNames) user(uid uint32) string {
	if s, ok := n.users[uid]; ok {
		return s
	}
	return strconv.FormatUint(uint64(uid), 10)
}

func (n *idNames) group(gid uint32) string {
	if s, ok := n.groups[gid]; ok {
		return s
	}
	return strconv.FormatUint(uint64(gid), 10)
}

// scanColon calls fn with the colon-separated fields of each line of path
// that has at least min fields, until fn returns false. Comments and blank
// lines are skipped.
func scanColon(path string, min int, fn func([]string) bool) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	// Lines are short: start small (a lookup runs on every process start)
	// and grow up to 1 MiB for an odd long line.
	sc.Buffer(make([]byte, 0, 4<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		fields := strings.Split(line, ":")
		if len(fields) < min {
			continue
		}
		if !fn(fields) {
			break
		}
	}
	return sc.Err()
}
