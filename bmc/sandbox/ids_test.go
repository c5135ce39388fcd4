//go:build linux

package sandbox

import (
	"os/user"
	"strconv"
	"strings"
	"testing"
)

func TestPluginIDs(t *testing.T) {
	defer func(u func(string) (*user.User, error), id func(string) (*user.User, error)) {
		lookupUser, lookupUID = u, id
	}(lookupUser, lookupUID)
	accounts := map[string]*user.User{}
	lookupUser = func(name string) (*user.User, error) {
		if u, ok := accounts[name]; ok {
			return u, nil
		}
		return nil, user.UnknownUserError(name)
	}
	lookupUID = func(uid string) (*user.User, error) {
		for _, u := range accounts {
			if u.Uid == uid {
				return u, nil
			}
		}
		n, _ := strconv.Atoi(uid)
		return nil, user.UnknownUserIdError(n)
	}

	// No account: a derived id, stable and in range.
	ids, err := PluginIDs("bcx-ipmi")
	if err != nil {
		t.Fatal(err)
	}
	if ids.UID != ids.GID || ids.UID < UIDBase || ids.UID >= UIDBase+UIDRange || ids.Source != "derived" || ids.UID != DerivedID("bcx-ipmi") {
		t.Errorf("derived ids %+v", ids)
	}
	if DerivedID("bcx-ipmi") == DerivedID("bcx-redfish") {
		t.Error("two plugin names share a uid")
	}

	// An operator's account wins.
	accounts["bcx-bcx-ipmi"] = &user.User{Username: "bcx-bcx-ipmi", Uid: "998", Gid: "997"}
	if ids, err := PluginIDs("bcx-ipmi"); err != nil || ids.UID != 998 || ids.GID != 997 || ids.Source != "user bcx-bcx-ipmi" {
		t.Errorf("account ids %+v %v", ids, err)
	}
	// ... but never one that is root.
	accounts["bcx-bad"] = &user.User{Username: "bcx-bad", Uid: "0", Gid: "0"}
	if _, err := PluginIDs("bad"); err == nil || !strings.Contains(err.Error(), "never runs as root") {
		t.Errorf("root account: %v", err)
	}
	// A derived uid someone else has is refused, naming the fix.
	taken := DerivedID("taken")
	accounts["somebody"] = &user.User{Username: "somebody", Uid: strconv.Itoa(taken), Gid: "100"}
	if _, err := PluginIDs("taken"); err == nil || !strings.Contains(err.Error(), "belongs to user somebody: create a user bcx-taken") {
		t.Errorf("taken uid: %v", err)
	}
}
