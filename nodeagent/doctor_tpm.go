package nodeagent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/tpm"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/internal/secretfile"
)

// tssGroup is the group that owns /dev/tpmrm0 on Debian and most
// distributions: its members can send the TPM any command.
const tssGroup = "tss"

// maxNodeKeyFile bounds the doctor's read of node.key: a PKCS#8 key or a TPM
// key's record is a few hundred bytes.
const maxNodeKeyFile = 16 << 10

// tpmFiles are the files checkTPM reads; tests point them elsewhere.
type tpmFiles struct {
	Group, Passwd, Device string
}

var hostTPMFiles = tpmFiles{Group: "/etc/group", Passwd: "/etc/passwd", Device: tpm.DefaultPath}

// checkTPM is bcd doctor's tpm check: where the node key is, and, on a node
// with [helper], that the unprivileged user is not in the tss group. The
// kernel's resource manager filters no command, so a member could change the
// hierarchies' authorization, clear the TPM or trip its lockout; bcd helper
// holds the node keys instead.
func checkTPM(cfg *config.Config, f tpmFiles) Result {
	if cfg.Helper != nil {
		user := cfg.Helper.User
		if user == "" {
			user = config.DefaultHelperUser
		}
		in, err := inGroup(f, user, tssGroup)
		switch {
		case err != nil:
			return Result{Warn, fmt.Sprintf("cannot tell whether %s is in the %s group: %v", user, tssGroup, err)}
		case in:
			return Result{Fail, fmt.Sprintf("%s is in the %s group: it can send the TPM any command (lock or clear its hierarchies); bcd helper holds the node keys, so remove it (gpasswd -d %s %s) and restart bcd.service",
				user, tssGroup, user, tssGroup)}
		}
	}
	// Through secretfile: a node.key swapped for a FIFO must not hang the doctor.
	key, err := secretfile.Read(filepath.Join(DataDir(cfg), agent.KeyFile), secretfile.Options{Limit: maxNodeKeyFile, NoFollow: true})
	_, devErr := os.Stat(f.Device)
	switch {
	case errors.Is(err, secretfile.ErrNotRegular):
		return Result{Fail, err.Error()}
	case err == nil && tpm.IsRecord(key) && devErr != nil:
		return Result{Fail, fmt.Sprintf("node.key is a TPM key's record, but %s is missing: the node key cannot be used", f.Device)}
	case err == nil && tpm.IsRecord(key):
		return Result{OK, fmt.Sprintf("the node key is in the TPM (%s)", f.Device)}
	case devErr == nil:
		return Result{OK, fmt.Sprintf("%s is present; the node key is not in it (a PKCS#8 node.key, or not joined yet)", f.Device)}
	}
	return Result{OK, fmt.Sprintf("no TPM (%s): the node key is a PKCS#8 file", f.Device)}
}

// inGroup reports whether user is a member of group, as a supplementary
// member in the group file or by its primary group in the passwd file.
func inGroup(f tpmFiles, user, group string) (bool, error) {
	groups, err := os.ReadFile(f.Group)
	if err != nil {
		return false, err
	}
	gid := ""
	for _, fields := range colonLines(groups) {
		if len(fields) < 4 || fields[0] != group {
			continue
		}
		gid = fields[2]
		for _, m := range strings.Split(fields[3], ",") {
			if strings.TrimSpace(m) == user {
				return true, nil
			}
		}
	}
	if gid == "" {
		return false, nil
	}
	passwd, err := os.ReadFile(f.Passwd)
	if err != nil {
		return false, err
	}
	for _, fields := range colonLines(passwd) {
		if len(fields) >= 4 && fields[0] == user && fields[3] == gid {
			return true, nil
		}
	}
	return false, nil
}

// colonLines splits a passwd-style file into its lines' fields, skipping
// comments and blank lines.
func colonLines(b []byte) [][]string {
	var out [][]string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, strings.Split(line, ":"))
	}
	return out
}
