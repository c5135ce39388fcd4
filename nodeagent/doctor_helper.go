package nodeagent

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/nodeagent/helper"
)

// helperOK is the helper check's detail when bcd helper would start.
const helperOK = "the helper's config, socket directory and slots path are root's"

// helperChecks are bcd doctor's helper checks on a node with [helper]: one
// failed check per path bcd helper would refuse to start on (as
// helper.StartupProblems finds them, so doctor and the helper judge alike), or
// one that says none would. The chains to the slots, the socket and the
// entrypoint are only checked as root, as the helper checks them; run by
// anyone else doctor says so instead of judging half of them. The number of
// checks depends on what is found, so this looks at the files when doctor
// makes its list, not when it runs it.
func helperChecks(cfg *config.Config, path string, root bool) []Check {
	if !root {
		return []Check{CheckFunc("helper", func(context.Context) Result {
			return Result{Warn, "the helper checks need root (bcd helper checks the ownership of its config, socket directory and slots path as root): run sudo bcd doctor"}
		})}
	}
	probs := helper.StartupProblems(cfg, path)
	if len(probs) == 0 {
		return []Check{CheckFunc("helper", func(context.Context) Result { return Result{OK, helperOK} })}
	}
	checks := make([]Check, len(probs))
	for i, p := range probs {
		detail := p.String() + ": bcd helper refuses to start"
		checks[i] = CheckFunc("helper", func(context.Context) Result { return Result{Fail, detail} })
	}
	return checks
}

// libvirtFiles are the files checkLibvirt reads; tests point them elsewhere.
type libvirtFiles struct {
	QemuConf, Group, Passwd string
}

var hostLibvirtFiles = libvirtFiles{QemuConf: "/etc/libvirt/qemu.conf", Group: "/etc/group", Passwd: "/etc/passwd"}

// libvirtGroup is the group of libvirt's read-write socket: root-equivalent.
const libvirtGroup = "libvirt"

// libvirtRerun is what fixes a helper host's libvirt (spec "Upgrading an
// unprivileged libvirt host").
const libvirtRerun = "rerun the install script generated with --unprivileged (and --instance-bridges for the instances' bridges)"

// hasLibvirt reports whether the host has libvirt's QEMU driver configured:
// only then is there a libvirt check.
func hasLibvirt(f libvirtFiles) bool {
	_, err := os.Stat(f.QemuConf)
	return err == nil
}

// checkLibvirt is bcd doctor's libvirt check on a host with qemu.conf. On a
// helper node libvirt must chown no path the node names (dynamic_ownership =
// 0), QEMU's user must reach the node's disk files through the node's group,
// and the node's user must not be in the libvirt group, which could define a
// domain that mounts any host file: root by another name.
func checkLibvirt(cfg *config.Config, f libvirtFiles) Result {
	if cfg.Helper == nil {
		return Result{OK, fmt.Sprintf("%s is present; bcd node runs as root, so libvirt's ownership settings are libvirt's own", f.QemuConf)}
	}
	user := helper.UserName(cfg)
	var wrong []string
	conf, err := os.ReadFile(f.QemuConf)
	if err != nil {
		return Result{Fail, fmt.Sprintf("%s does not read: %v", f.QemuConf, err)}
	}
	if v, ok := qemuConfValue(conf, "dynamic_ownership"); !ok {
		wrong = append(wrong, fmt.Sprintf("%s does not set dynamic_ownership = 0 (libvirt's default 1 chowns every path the node names)", f.QemuConf))
	} else if v != "0" {
		wrong = append(wrong, fmt.Sprintf("%s sets dynamic_ownership = %s, want 0 (libvirt would chown every path the node names)", f.QemuConf, v))
	}
	qemuUser := ""
	for _, u := range []string{"libvirt-qemu", "qemu"} {
		if ok, err := hasUser(f.Passwd, u); err != nil {
			return Result{Warn, fmt.Sprintf("cannot tell whether the user %s exists: %v", u, err)}
		} else if ok {
			qemuUser = u
			break
		}
	}
	files := tpmFiles{Group: f.Group, Passwd: f.Passwd}
	if qemuUser == "" {
		wrong = append(wrong, "neither libvirt-qemu nor qemu is a user here, so QEMU cannot reach the node's disk files through the "+user+" group")
	} else if in, err := inGroup(files, qemuUser, user); err != nil {
		return Result{Warn, fmt.Sprintf("cannot tell whether %s is in the %s group: %v", qemuUser, user, err)}
	} else if !in {
		wrong = append(wrong, fmt.Sprintf("%s is not in the %s group, so QEMU cannot reach the node's disk files (gpasswd -a %s %s)", qemuUser, user, qemuUser, user))
	}
	if in, err := inGroup(files, user, libvirtGroup); err != nil {
		return Result{Warn, fmt.Sprintf("cannot tell whether %s is in the %s group: %v", user, libvirtGroup, err)}
	} else if in {
		wrong = append(wrong, fmt.Sprintf("%s is in the %s group, which is root-equivalent; domains go through bcd helper's checked operations, so remove it (gpasswd -d %s %s)", user, libvirtGroup, user, libvirtGroup))
	}
	if len(wrong) > 0 {
		return Result{Fail, strings.Join(wrong, "; ") + "; " + libvirtRerun}
	}
	return Result{OK, fmt.Sprintf("dynamic_ownership = 0 in %s, %s in the %s group, %s not in the %s group", f.QemuConf, qemuUser, user, user, libvirtGroup)}
}

// qemuConfValue is the value of the last uncommented key = value line for
// key in qemu.conf (libvirt's own format; the last one wins), without quotes.
func qemuConfValue(conf []byte, key string) (string, bool) {
	var v string
	found := false
	sc := bufio.NewScanner(bytes.NewReader(conf))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		k, val, ok := strings.Cut(line, "=")
		if !ok || strings.HasPrefix(line, "#") || strings.TrimSpace(k) != key {
			continue
		}
		val, _, _ = strings.Cut(val, "#")
		v, found = strings.Trim(strings.TrimSpace(val), `"`), true
	}
	return v, found
}

// hasUser reports whether the passwd file has user.
func hasUser(passwd, user string) (bool, error) {
	b, err := os.ReadFile(passwd)
	if err != nil {
		return false, err
	}
	for _, fields := range colonLines(b) {
		if fields[0] == user {
			return true, nil
		}
	}
	return false, nil
}
