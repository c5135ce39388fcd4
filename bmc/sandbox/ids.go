package sandbox

import (
	"errors"
	"fmt"
	"hash/fnv"
	"os/user"
	"strconv"
)

// The uids and gids plugins without an account of their own run as.
const (
	UIDBase  = 0x70000000
	UIDRange = 1 << 24
)

// UserPrefix starts the name of a plugin's own account.
const UserPrefix = "bcx-"

// IDs are the uid and gid a plugin runs as, and where they came from.
type IDs struct {
	UID, GID int
	Source   string // "user bcx-ipmi" or "derived"
}

// lookups are os/user's, replaced in tests.
var (
	lookupUser = user.Lookup
	lookupUID  = user.LookupId
)

// PluginIDs returns the identity a confined plugin runs as: its bcx-<name> account
// when there is one, else a uid derived from its name that no account has.
func PluginIDs(name string) (IDs, error) {
	account := UserPrefix + name
	if len(account) <= 32 {
		u, err := lookupUser(account)
		switch {
		case err == nil:
			uid, err1 := strconv.Atoi(u.Uid)
			gid, err2 := strconv.Atoi(u.Gid)
			if err1 != nil || err2 != nil {
				return IDs{}, fmt.Errorf("user %s has uid %q gid %q: not numbers", account, u.Uid, u.Gid)
			}
			if uid == 0 || gid == 0 {
				return IDs{}, fmt.Errorf("user %s has uid %d gid %d: a plugin never runs as root (give it an unprivileged uid and gid)", account, uid, gid)
			}
			return IDs{UID: uid, GID: gid, Source: "user " + account}, nil
		case !errors.As(err, new(user.UnknownUserError)):
			return IDs{}, fmt.Errorf("look up user %s: %w", account, err)
		}
	}
	id := DerivedID(name)
	if u, err := lookupUID(strconv.Itoa(id)); err == nil {
		return IDs{}, fmt.Errorf("uid %d, derived for plugin %s, belongs to user %s: create a user %s for the plugin", id, name, u.Username, account)
	} else if !errors.As(err, new(user.UnknownUserIdError)) {
		return IDs{}, fmt.Errorf("look up uid %d: %w", id, err)
	}
	return IDs{UID: id, GID: id, Source: "derived"}, nil
}

// DerivedID is the uid and gid of a plugin without an account: FNV-1a of its name,
// folded into the plugin range, so it stays the same across restarts and hosts.
func DerivedID(name string) int {
	h := fnv.New32a()
	h.Write([]byte(name))
	return UIDBase + int(h.Sum32()%UIDRange)
}
