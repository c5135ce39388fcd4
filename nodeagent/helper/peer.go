package helper

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/agent/selfupdate"
)

// peer is who is on the other end of a connection, as the kernel says.
type peer struct {
	pid      int32
	uid, gid uint32
	exe      string
}

// peerOf reads SO_PEERCRED of c: the credentials the caller had when it
// connected, which it cannot forge.
func peerOf(c net.Conn) (peer, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return peer{}, fmt.Errorf("the connection is a %T, not a unix socket", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return peer{}, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return peer{}, err
	}
	if cerr != nil {
		return peer{}, fmt.Errorf("SO_PEERCRED: %w", cerr)
	}
	return peer{pid: cred.Pid, uid: cred.Uid, gid: cred.Gid}, nil
}

// checkPeer serves only root or the node user (uid and gid both), running an
// installed bcd. Every refusal is logged: something on the host that is not
// bcd node is knocking on root's door.
func (s *Server) checkPeer(c net.Conn) error {
	if c == nil {
		return errors.New("the connection is unknown")
	}
	p, err := peerOf(c)
	if err != nil {
		s.Logger.Warn("refused a caller", "err", err.Error())
		return fmt.Errorf("the caller's credentials: %w", err)
	}
	err = s.checkCred(p)
	if err == nil {
		err = s.checkExe(&p)
	}
	if err != nil {
		s.Logger.Warn("refused a caller", "pid", p.pid, "uid", p.uid, "gid", p.gid, "exe", p.exe, "why", err.Error())
	}
	return err
}

func (s *Server) checkCred(p peer) error {
	if p.uid == 0 || (p.uid == uint32(s.NodeUID) && p.gid == uint32(s.NodeGID)) {
		return nil
	}
	return fmt.Errorf("the caller (pid %d) runs as uid %d gid %d; bcd helper serves only root or the [helper] user %s (uid %d gid %d)",
		p.pid, p.uid, p.gid, UserName(s.Config), s.NodeUID, s.NodeGID)
}

// checkExe checks /proc/<pid>/exe against the installed binaries, by path
// (a copy elsewhere is refused) and by file (the path must still be the file
// the process runs; a replaced or deleted one is refused).
func (s *Server) checkExe(p *peer) error {
	proc := "/proc/" + strconv.Itoa(int(p.pid)) + "/exe"
	exe, err := os.Readlink(proc)
	if err != nil {
		return fmt.Errorf("the caller (pid %d, uid %d gid %d): %s: %v", p.pid, p.uid, p.gid, proc, err)
	}
	p.exe = exe
	allowed := s.allowedExes()
	refuse := func(why string) error {
		return fmt.Errorf("the caller (pid %d, uid %d gid %d) runs %s: %s; bcd helper serves only an installed bcd ([update] entrypoint, bcd-a or bcd-b in the slots directory, or the helper's own binary): %s",
			p.pid, p.uid, p.gid, exe, why, strings.Join(allowed, ", "))
	}
	if strings.HasSuffix(exe, " (deleted)") {
		return refuse("a deleted file")
	}
	running, err := os.Stat(proc)
	if err != nil {
		return refuse(err.Error())
	}
	for _, a := range allowed {
		if a != exe {
			continue
		}
		fi, err := os.Stat(a)
		if err == nil && os.SameFile(fi, running) {
			return nil
		}
		if a == s.SelfExe && s.self != nil && os.SameFile(s.self, running) {
			return nil
		}
		return refuse("no longer the file at that path")
	}
	return refuse("not an installed bcd")
}

// allowedExes is the installed bcd binaries, their symlinks resolved: the
// entrypoint (which links to a slot once updated), bcd-a and bcd-b in the
// slots directory, and the helper's own binary. Computed per request: a
// swap changes where the entrypoint links.
func (s *Server) allowedExes() []string {
	slots := s.Config.SlotsDir()
	var out []string
	seen := map[string]bool{}
	for _, p := range []string{Entrypoint(s.Config), filepath.Join(slots, selfupdate.SlotFile(selfupdate.SlotA)), filepath.Join(slots, selfupdate.SlotFile(selfupdate.SlotB))} {
		r, err := filepath.EvalSymlinks(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			r = p
		}
		if !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	if !seen[s.SelfExe] {
		out = append(out, s.SelfExe)
	}
	return out
}
