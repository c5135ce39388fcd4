package config

import (
	"fmt"
	"net/url"
	"path"
	"strings"
)

// The defaults of keys a file leaves out.
const (
	DefaultDataDir      = "/var/lib/bcd"
	DefaultSocketPath   = "/run/bcd/bcd.sock"
	DefaultHelperSocket = "/run/bcd-helper/helper.sock"
	DefaultHelperUser   = "bcd"
	DefaultEntrypoint   = "/usr/local/bin/bcd"
	// DefaultHelperSlotsDir holds the self-update slots on a helper node,
	// where root, not the node, owns them.
	DefaultHelperSlotsDir = "/usr/local/lib/bcd"
	DefaultPluginMemory   = 256 << 20
	DefaultPluginPids     = 128
	DefaultJournalEntries = 10000
	DefaultIMDSListen     = "169.254.169.254:80"
)

// The key table: adding a key is one entry here and a field in its struct.
var schema = []section{
	{
		present: func(*Config) bool { return true },
		fields: []field{
			str("gateway_url", func(c *Config) *string { return &c.GatewayURL }, webURL),
			str("site", func(c *Config) *string { return &c.Site }, text),
			str("serving_ca_spki_pin", func(c *Config) *string { return &c.ServingCASPKIPin }, pin),
			str("join_signing_key_pin", func(c *Config) *string { return &c.JoinSigningKeyPin }, pin),
			str("join_encryption_key_pin", func(c *Config) *string { return &c.JoinEncryptionKeyPin }, pin),
			str("data_dir", func(c *Config) *string { return &c.DataDir }, absPath).or(DefaultDataDir),
			str("socket_path", func(c *Config) *string { return &c.SocketPath }, socketPath).or(DefaultSocketPath),
			str("gateway_server_name", func(c *Config) *string { return &c.GatewayServerName }, dnsName),
		},
		check: checkTop,
	},
	sect("boot", func(c *Config) **Boot { return &c.Boot }, checkBoot,
		str("listen", func(c *Config) *string { return &c.Boot.Listen }, hostPort),
		str("url", func(c *Config) *string { return &c.Boot.URL }, webURL),
		str("kernel", func(c *Config) *string { return &c.Boot.Kernel }, webURL),
		str("initrd", func(c *Config) *string { return &c.Boot.Initrd }, webURL),
		str("cmdline", func(c *Config) *string { return &c.Boot.Cmdline }, printable),
		str("server_ip", func(c *Config) *string { return &c.Boot.ServerIP }, ipv4),
		boolean("proxy_dhcp", func(c *Config) *bool { return &c.Boot.ProxyDHCP }),
		str("tftp", func(c *Config) *string { return &c.Boot.TFTP }, hostPort),
		str("tftp_root", func(c *Config) *string { return &c.Boot.TFTPRoot }, absPath),
		str("interface", func(c *Config) *string { return &c.Boot.Interface }, ifName),
		str("ramdisk_dir", func(c *Config) *string { return &c.Boot.RamdiskDir }, absPath),
		// The TFTP server's capacity and bounds; absent means its defaults
		// (boot.DefaultTFTPMaxTransfers, boot.DefaultTFTPTransferTimeout).
		integer("tftp_max_transfers", func(c *Config) *int64 { return &c.Boot.TFTPMaxTransfers }, 1),
		integer("tftp_transfer_timeout", func(c *Config) *int64 { return &c.Boot.TFTPTransferTimeout }, 1),
		boolean("trust_any_neighbor", func(c *Config) *bool { return &c.Boot.TrustAnyNeighbor }),
	),
	sect("plugins", func(c *Config) **Plugins { return &c.Plugins }, nil,
		str("dir", func(c *Config) *string { return &c.Plugins.Dir }, absPath),
		str("cgroup", func(c *Config) *string { return &c.Plugins.Cgroup }, cgroupPath),
		list("privileged", func(c *Config) *[]string { return &c.Plugins.Privileged }, pluginName),
		integer("memory_max", func(c *Config) *int64 { return &c.Plugins.MemoryMax }, 1).or(int64(DefaultPluginMemory)),
		integer("pids_max", func(c *Config) *int64 { return &c.Plugins.PidsMax }, 1).or(int64(DefaultPluginPids)),
	),
	sect("helper", func(c *Config) **Helper { return &c.Helper }, nil,
		str("socket", func(c *Config) *string { return &c.Helper.Socket }, socketPath).or(DefaultHelperSocket),
		str("user", func(c *Config) *string { return &c.Helper.User }, userName).or(DefaultHelperUser),
		list("instance_bridges", func(c *Config) *[]string { return &c.Helper.InstanceBridges }, ifName),
	),
	sect("update", func(c *Config) **Update { return &c.Update }, checkUpdate,
		list("release_pins", func(c *Config) *[]string { return &c.Update.ReleasePins }, pin),
		integer("release_threshold", func(c *Config) *int64 { return &c.Update.ReleaseThreshold }, 1).or(int64(1)),
		integer("release_sequence", func(c *Config) *int64 { return &c.Update.ReleaseSequence }, 0),
		str("slots_dir", func(c *Config) *string { return &c.Update.SlotsDir }, absPath),
		str("entrypoint", func(c *Config) *string { return &c.Update.Entrypoint }, absPath).or(DefaultEntrypoint),
	),
	sect("journal", func(c *Config) **Journal { return &c.Journal }, nil,
		str("path", func(c *Config) *string { return &c.Journal.Path }, absPath).
			orFunc(func(c *Config) any { return path.Join(c.dataDir(), "journal.db") }),
		integer("max_entries", func(c *Config) *int64 { return &c.Journal.MaxEntries }, 1).or(int64(DefaultJournalEntries)),
	),
	sect("log", func(c *Config) **Log { return &c.Log }, nil,
		str("level", func(c *Config) *string { return &c.Log.Level }, oneOf("debug", "info", "warn", "error")).or("info"),
		str("format", func(c *Config) *string { return &c.Log.Format }, oneOf("json", "text", "auto")).or("auto"),
	),
	sect("imds", func(c *Config) **IMDS { return &c.IMDS }, nil,
		boolean("enabled", func(c *Config) *bool { return &c.IMDS.Enabled }),
		str("listen", func(c *Config) *string { return &c.IMDS.Listen }, hostPort).or(DefaultIMDSListen),
	),
	sect("host", func(c *Config) **Host { return &c.Host }, nil,
		list("units", func(c *Config) *[]string { return &c.Host.Units }, unitName),
		str("command_root_sha256", func(c *Config) *string { return &c.Host.CommandRootSHA256 }, sha256Hex),
	),
	// [metrics] is bcd site's Prometheus endpoint; a section of its own so
	// that [boot]'s keys can grow beside it.
	sect("metrics", func(c *Config) **Metrics { return &c.Metrics }, checkMetrics,
		str("listen", func(c *Config) *string { return &c.Metrics.Listen }, hostPort),
	),
}

var sections = func() map[string]*section {
	m := make(map[string]*section, len(schema))
	for i := range schema {
		m[schema[i].name] = &schema[i]
	}
	return m
}()

type kind string

const (
	kindString kind = "a string"
	kindInt    kind = "an integer"
	kindBool   kind = "a boolean"
)

func kindOf(v any) kind {
	switch v.(type) {
	case int64:
		return kindInt
	case bool:
		return kindBool
	}
	return kindString
}

// A field is one key: its TOML type, how to check and store a value, and
// how to read it back for Format.
type field struct {
	name string
	kind kind
	set  func(c *Config, v any) error
	get  func(c *Config) any
	def  func(c *Config) any // nil: the zero value
}

func (f field) or(v any) field { return f.orFunc(func(*Config) any { return v }) }

func (f field) orFunc(def func(*Config) any) field {
	f.def = def
	return f
}

// A section is the top level ("") or a [section] and its keys.
type section struct {
	name    string
	fields  []field
	open    func(c *Config)
	present func(c *Config) bool
	// check applies the rules between keys once they are all set. line
	// gives where a key was written, or 0 when it was not.
	check func(c *Config, opts ParseOptions, line func(key string) int) []*Error
}

func (s *section) field(name string) *field {
	for i := range s.fields {
		if s.fields[i].name == name {
			return &s.fields[i]
		}
	}
	return nil
}

func sect[S any](name string, p func(*Config) **S, check func(*Config, ParseOptions, func(string) int) []*Error, fields ...field) section {
	return section{
		name:    name,
		fields:  fields,
		open:    func(c *Config) { *p(c) = new(S) },
		present: func(c *Config) bool { return *p(c) != nil },
		check:   check,
	}
}

func str(name string, p func(*Config) *string, valid func(string) (string, error)) field {
	return field{name: name, kind: kindString,
		set: func(c *Config, v any) error {
			s, err := valid(v.(string))
			if err == nil {
				*p(c) = s
			}
			return err
		},
		get: func(c *Config) any { return *p(c) },
	}
}

func integer(name string, p func(*Config) *int64, least int64) field {
	return field{name: name, kind: kindInt,
		set: func(c *Config, v any) error {
			n := v.(int64)
			if n < least {
				return fmt.Errorf("must be at least %d", least)
			}
			*p(c) = n
			return nil
		},
		get: func(c *Config) any { return *p(c) },
	}
}

func boolean(name string, p func(*Config) *bool) field {
	return field{name: name, kind: kindBool,
		set: func(c *Config, v any) error { *p(c) = v.(bool); return nil },
		get: func(c *Config) any { return *p(c) },
	}
}

// list is a comma-separated string, the subset having no arrays.
func list(name string, p func(*Config) *[]string, valid func(string) (string, error)) field {
	return field{name: name, kind: kindString,
		set: func(c *Config, v any) error {
			var items []string
			if s := v.(string); strings.TrimSpace(s) != "" {
				for _, item := range strings.Split(s, ",") {
					item = strings.TrimSpace(item)
					if item == "" {
						return fmt.Errorf("empty item in list %q", s)
					}
					item, err := valid(item)
					if err != nil {
						return err
					}
					for _, prev := range items {
						if prev == item {
							return fmt.Errorf("%q is listed twice", item)
						}
					}
					items = append(items, item)
				}
			}
			*p(c) = items
			return nil
		},
		get: func(c *Config) any { return strings.Join(*p(c), ",") },
	}
}

// decode gives the document's values their meaning.
func decode(c *Config, doc *document, opts ParseOptions) ErrorList {
	var errs ErrorList
	fail := func(line int, format string, args ...any) {
		errs = append(errs, &Error{Line: line, Msg: fmt.Sprintf(format, args...)})
	}
	tables := map[string]*table{}
	for _, t := range doc.tables {
		s, ok := sections[t.name]
		if !ok {
			fail(t.line, "unknown section [%s]", t.name)
			continue
		}
		tables[t.name] = t
		if s.open != nil {
			s.open(c)
		}
		for _, e := range t.keys {
			f := s.field(e.key)
			switch {
			case f == nil && t.name != "" && sections[""].field(e.key) != nil:
				fail(e.line, "unknown key %q in [%s] (top-level keys go before the first section)", e.key, t.name)
			case f == nil && t.name != "":
				fail(e.line, "unknown key %q in [%s]", e.key, t.name)
			case f == nil:
				fail(e.line, "unknown key %q", e.key)
			case kindOf(e.val) != f.kind:
				fail(e.line, "%s must be %s, not %s", qualify(t.name, e.key), f.kind, kindOf(e.val))
			default:
				if err := f.set(c, e.val); err != nil {
					fail(e.line, "%s: %v", qualify(t.name, e.key), err)
				}
			}
		}
	}
	// Defaults after every key, so one may depend on another (the journal
	// lives in data_dir).
	for i := range schema {
		s := &schema[i]
		t, ok := tables[s.name]
		if !ok {
			continue
		}
		for _, f := range s.fields {
			if _, set := t.seen[f.name]; !set && f.def != nil {
				if err := f.set(c, f.def(c)); err != nil {
					fail(t.line, "default %s: %v", qualify(s.name, f.name), err)
				}
			}
		}
	}
	// The rules between keys go by where keys were written, not by their
	// values, so a bad value does not also count as a missing one.
	for i := range schema {
		s := &schema[i]
		t, ok := tables[s.name]
		if !ok || s.check == nil {
			continue
		}
		errs = append(errs, s.check(c, opts, func(key string) int { return t.seen[key] })...)
	}
	return errs
}

func qualify(section, key string) string {
	if section == "" {
		return key
	}
	return "[" + section + "] " + key
}

func checkTop(c *Config, opts ParseOptions, line func(string) int) []*Error {
	if u, err := url.Parse(c.GatewayURL); err == nil && u.Scheme == "http" && !opts.AllowHTTP {
		return []*Error{{Line: line("gateway_url"), Msg: "gateway_url must be https:// (http:// only in a development build)"}}
	}
	return nil
}

func checkBoot(c *Config, _ ParseOptions, line func(string) int) []*Error {
	var missing []string
	for _, k := range []string{"server_ip", "url"} {
		if line(k) == 0 {
			missing = append(missing, k)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	var errs []*Error
	need := func(key string) {
		errs = append(errs, &Error{Line: line(key),
			Msg: fmt.Sprintf("[boot] %s needs server_ip and url (missing %s)", key, strings.Join(missing, " and "))})
	}
	if c.Boot.ProxyDHCP {
		need("proxy_dhcp")
	}
	if line("tftp") != 0 {
		need("tftp")
	}
	return errs
}

// checkMetrics: a [metrics] section turns the endpoint on, so it must say
// where; there is no default port to open by surprise.
func checkMetrics(_ *Config, _ ParseOptions, line func(string) int) []*Error {
	if line("listen") == 0 {
		return []*Error{{Msg: "[metrics] needs listen, the host:port of the /metrics endpoint (such as 127.0.0.1:9464); leave the section out to serve none"}}
	}
	return nil
}

func checkUpdate(c *Config, _ ParseOptions, line func(string) int) []*Error {
	u := c.Update
	if n := int64(len(u.ReleasePins)); n > 0 && u.ReleaseThreshold > n {
		at := line("release_threshold")
		if at == 0 {
			at = line("release_pins")
		}
		return []*Error{{Line: at, Msg: fmt.Sprintf("[update] release_threshold %d is more than the %d release_pins", u.ReleaseThreshold, n)}}
	}
	return nil
}

func (c *Config) dataDir() string {
	if c.DataDir == "" {
		return DefaultDataDir
	}
	return c.DataDir
}

// JournalOrDefault returns [journal], or what an empty one would hold.
func (c *Config) JournalOrDefault() Journal {
	return orDefault(c, "journal", func(c *Config) **Journal { return &c.Journal })
}

// LogOrDefault returns [log], or what an empty one would hold.
func (c *Config) LogOrDefault() Log {
	return orDefault(c, "log", func(c *Config) **Log { return &c.Log })
}

// UpdateOrDefault returns [update], or what an empty one would hold.
func (c *Config) UpdateOrDefault() Update {
	return orDefault(c, "update", func(c *Config) **Update { return &c.Update })
}

// SlotsDir is where self-update keeps its slots: [update] slots_dir, else
// root's directory on a helper node, else <data_dir>/bin.
func (c *Config) SlotsDir() string {
	switch {
	case c.Update != nil && c.Update.SlotsDir != "":
		return c.Update.SlotsDir
	case c.Helper != nil:
		return DefaultHelperSlotsDir
	}
	return path.Join(c.dataDir(), "bin")
}

func orDefault[S any](c *Config, name string, p func(*Config) **S) S {
	if s := *p(c); s != nil {
		return *s
	}
	d := *c
	s := sections[name]
	s.open(&d)
	for _, f := range s.fields {
		if f.def != nil {
			_ = f.set(&d, f.def(&d)) // the defaults are valid; a bad data_dir leaves the path empty
		}
	}
	return **p(&d)
}
