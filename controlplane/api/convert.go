package api

import (
	"encoding/base64"
	"encoding/json"
	"github.com/better-compute/bcd/protocol"
	"time"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/store"
)

// This file is the one place the api turns store rows into the resources
// it answers with (apitype), and so the one place secrets are kept out of
// them: a BMC's password (has_password instead), the content of a
// command's files (a deploy.image's join token), and the credentials an
// image URL may carry. A handler never writes a store row itself.

func toSite(s store.Site) apitype.Site {
	return apitype.Site{Name: s.Name, Approval: s.Approval, HTTPProxy: s.HTTPProxy, SpecRevision: s.SpecRevision,
		CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt}
}

func toSites(ss []store.Site) []apitype.Site {
	out := make([]apitype.Site, 0, len(ss))
	for _, s := range ss {
		out = append(out, toSite(s))
	}
	return out
}

// toToken is t and its state at now; never its hash.
func toToken(t store.Token, now time.Time) apitype.TokenInfo {
	return apitype.TokenInfo{ID: t.ID, Pool: t.Pool, Site: t.Site, Role: t.Role, NodeID: t.NodeID, MachineID: t.MachineID,
		AllowReclaim: t.AllowReclaim, CreatedAt: t.CreatedAt, ExpiresAt: t.ExpiresAt, UsedAt: t.UsedAt, UsedBy: t.UsedBy,
		RevokedAt: t.RevokedAt, State: tokenState(t, now)}
}

// tokenState says whether t can still be used at now, and if not why.
func tokenState(t store.Token, now time.Time) string {
	switch {
	case !t.RevokedAt.IsZero():
		return apitype.TokenRevoked
	case !t.UsedAt.IsZero():
		return apitype.TokenUsed
	case !now.Before(t.ExpiresAt):
		return apitype.TokenExpired
	}
	return apitype.TokenActive
}

// toNode is n with its latest report on its daemon section (nil: none).
func toNode(n store.Node, daemon *store.SectionStatus) apitype.NodeInfo {
	info := apitype.NodeInfo{ID: n.ID, Role: n.Role, Site: n.Site, Pool: n.Pool, SPIFFEID: n.SPIFFEID, Claims: n.Claims,
		SystemUUID: n.SystemUUID, TPMEKSHA256: n.TPMEKSHA256, TPMEKProven: n.TPMEKProven, ProvenEKSHA256: n.ProvenEKSHA256, CertSerial: n.CertSerial, CertNotAfter: n.CertNotAfter,
		State: n.State, Cordoned: n.Cordoned, CreatedAt: n.CreatedAt, UpdatedAt: n.UpdatedAt, JoinedAt: n.JoinedAt,
		DeletedAt: n.DeletedAt, SessionID: n.SessionID, DaemonVersion: n.DaemonVersion, LastSeenAt: n.LastSeenAt,
		SpecRevision: n.SpecRevision, Connected: n.SessionID != 0, DaemonArch: n.DaemonArch}
	if n.DaemonTarget != nil {
		info.DaemonTarget = n.DaemonTarget.Version
	}
	if daemon != nil {
		info.DaemonSection = &apitype.SectionStatus{State: daemon.State, Reason: daemon.Reason, Message: daemon.Message,
			Version: daemon.Version, Revision: daemon.Revision}
	}
	return info
}

// toRelease is r without its manifest, with each binary's URL.
func toRelease(r store.Release) apitype.Release {
	out := apitype.Release{Version: r.Version, Product: r.Product, Sequence: r.Sequence, Expires: r.Expires, URLBase: r.URLBase,
		Binaries: make([]apitype.ReleaseBinary, 0, len(r.Binaries)), AddedAt: r.AddedAt}
	for _, b := range r.Binaries {
		out.Binaries = append(out.Binaries, apitype.ReleaseBinary{Arch: b.Arch, Name: b.Name, Size: b.Size, SHA256: b.SHA256, URL: r.BinaryURL(b.Arch)})
	}
	return out
}

// toRollout is r with its nodes and timeline when it has them (waves and,
// with nodes read, the two lists are never null).
func toRollout(r store.Rollout) apitype.Rollout {
	out := apitype.Rollout{ID: r.ID, Version: r.Version, Role: r.Role, Pool: r.Pool, Site: r.Site, Waves: r.Waves,
		MaxUnavailable: r.MaxUnavailable, FailureThreshold: r.FailureThreshold, WaveTimeout: r.WaveTimeout.String(),
		State: r.State, Reason: r.Reason, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt}
	if out.Waves == nil {
		out.Waves = []int{}
	}
	for _, n := range r.Nodes {
		out.Nodes = append(out.Nodes, apitype.RolloutNode{Node: n.NodeID, Pool: n.Pool, Wave: n.Wave, State: n.State, Reason: n.Reason,
			Message: n.Message, CommandID: n.CommandID, StartedAt: n.StartedAt, FinishedAt: n.FinishedAt})
	}
	for _, e := range r.Timeline {
		out.Timeline = append(out.Timeline, apitype.RolloutEvent{At: e.At, Message: e.Message})
	}
	return out
}

// toCommand is c with the content of every file in its params (a
// deploy.image's config, join token and node id) replaced by
// content_redacted and content_bytes, and its image url redacted like a
// deployment's (redactImageURL). The agent gets the params whole; an
// operator reading the command back never sees the join token.
func toCommand(c store.Command) apitype.Command {
	return apitype.Command{ID: c.ID, NodeID: c.NodeID, MachineID: c.MachineID, Kind: c.Kind, Params: redactParams(c.Params),
		State: c.State, Reason: c.Reason, Message: c.Message, Progress: c.Progress, Result: c.Result,
		CreatedAt: c.CreatedAt, UpdatedAt: c.UpdatedAt, SentAt: c.SentAt}
}

func redactParams(params json.RawMessage) json.RawMessage {
	if len(params) == 0 {
		return params
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(params, &obj); err != nil {
		// Params that are not an object cannot be shown safely.
		return nil
	}
	redactImageURL(obj)
	raw, ok := obj["files"]
	if !ok {
		out, err := json.Marshal(obj)
		if err != nil {
			return nil
		}
		return out
	}
	var files []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &files); err != nil {
		delete(obj, "files")
	} else {
		for _, f := range files {
			c, ok := f["content"]
			if !ok {
				continue
			}
			delete(f, "content")
			var b64 string
			n := -1
			if json.Unmarshal(c, &b64) == nil {
				if b, err := base64.StdEncoding.DecodeString(b64); err == nil {
					n = len(b)
				}
			}
			f["content_redacted"] = json.RawMessage("true")
			if n >= 0 {
				f["content_bytes"], _ = json.Marshal(n)
			}
		}
		obj["files"], _ = json.Marshal(files)
	}
	out, err := json.Marshal(obj)
	if err != nil {
		return nil
	}
	return out
}

// redactImageURL puts a deploy.image's image.url through protocol.RedactURL,
// as toDeployment does (userinfo and a presigned URL's query go); image
// params that do not decode lose the url.
func redactImageURL(obj map[string]json.RawMessage) {
	raw, ok := obj["image"]
	if !ok {
		return
	}
	var img map[string]json.RawMessage
	if err := json.Unmarshal(raw, &img); err != nil {
		delete(obj, "image")
		return
	}
	u, ok := img["url"]
	if !ok {
		return
	}
	var s string
	if err := json.Unmarshal(u, &s); err != nil {
		delete(img, "url")
	} else {
		img["url"], _ = json.Marshal(protocol.RedactURL(s))
	}
	obj["image"], _ = json.Marshal(img)
}

// toMachine is m as the api shows it: its BMC without the password, with
// its site's approval policy and whether its nodes are connected (the
// caller looks those up).
func toMachine(m store.Machine, siteApproval string, ramdiskConnected, nodeConnected bool) apitype.MachineInfo {
	info := apitype.MachineInfo{ID: m.ID, Name: m.Name, Site: m.Site, MACs: m.MACs, BootMode: m.EffectiveBootMode(), BootOverride: m.BootOverride,
		Firmware: m.Firmware, State: m.State, StateReason: m.StateReason, StateChangedAt: m.StateChangedAt,
		RamdiskNode: m.RamdiskNode, Node: m.Node, Deployment: m.Deployment, Inventory: m.Inventory,
		InventoryAt: m.InventoryAt, Approved: m.Approved, LastBootStage: m.LastBootStage, LastBootAt: m.LastBootAt,
		CreatedAt: m.CreatedAt, UpdatedAt: m.UpdatedAt, SiteApproval: siteApproval,
		RamdiskConnected: ramdiskConnected, NodeConnected: nodeConnected, TPMEKSHA256: m.TPMEKSHA256, TPMPool: m.TPMPool}
	if m.BMC != nil {
		info.BMC = &apitype.MachineBMCInfo{Address: m.BMC.Address, Port: m.BMC.Port, Username: m.BMC.Username,
			HasPassword: m.BMC.Password != "", CipherSuite: m.BMC.CipherSuite}
	}
	return info
}

// toDeployment is d with its image URL stripped of userinfo, query and
// fragment, which may hold a credential.
func toDeployment(d store.Deployment) apitype.Deployment {
	spec := apitype.DeploySpec{Image: d.Spec.Image, Target: d.Spec.Target, After: d.Spec.After, Cmdline: d.Spec.Cmdline,
		Pool: d.Spec.Pool, BCDVersion: d.Spec.BCDVersion,
		// The seed's user-data and network-config may hold secrets: shown
		// are the host name and keys only.
		Seed: apitype.Seed{Hostname: d.Spec.Seed.Hostname, SSHAuthorizedKeys: d.Spec.Seed.SSHAuthorizedKeys}}
	spec.Image.URL = protocol.RedactURL(spec.Image.URL)
	return apitype.Deployment{ID: d.ID, MachineID: d.MachineID, Spec: spec, Step: d.Step, Deadline: d.Deadline,
		BootAttempts: d.BootAttempts, DeployAttempts: d.DeployAttempts, DeployFailures: d.DeployFailures,
		BMCAttempts: d.BMCAttempts, CommandID: d.CommandID, RamdiskNode: d.RamdiskNode, LeftRamdisk: d.LeftRamdisk, NodeID: d.NodeID,
		TokenID: d.TokenID, LostAt: d.LostAt, NodeSession: d.NodeSession, NodeBootID: d.NodeBootID,
		Outcome: d.Outcome, FinishedAt: d.FinishedAt, Version: d.Version, CreatedAt: d.CreatedAt, UpdatedAt: d.UpdatedAt}
}

func toEvents(evs []store.MachineEvent) []apitype.MachineEvent {
	out := make([]apitype.MachineEvent, 0, len(evs))
	for _, e := range evs {
		out = append(out, apitype.MachineEvent{ID: e.ID, MachineID: e.MachineID, Time: e.Time, Kind: e.Kind,
			Message: e.Message, NodeID: e.NodeID, CommandID: e.CommandID, Data: e.Data})
	}
	return out
}

func toEnrollment(e store.TPMEnrollment) apitype.TPMEnrollment {
	return apitype.TPMEnrollment{EKSHA256: e.EKSHA256, Site: e.Site, Pool: e.Pool, MachineID: e.MachineID, CreatedAt: e.CreatedAt}
}

// toPoolPolicy is p; a pool without a policy has no attestors listed.
func toPoolPolicy(p store.PoolPolicy) apitype.PoolPolicy {
	attestors := p.JoinAttestors
	if attestors == nil {
		attestors = []string{}
	}
	return apitype.PoolPolicy{Pool: p.Pool, JoinAttestors: attestors, MaxUnavailable: p.MaxUnavailable, UpdatedAt: p.UpdatedAt}
}
