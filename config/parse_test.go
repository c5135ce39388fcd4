package config

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const (
	pinA = "sha256/ypeBEsobvcr6wjGzmiPcTaeG7/gUfE5yuYB3ha/uSLs="
	pinB = "sha256/PiPoFgA5WUoziU9lZOGxNIu9egCI1CxKy3PurtWcAJ0="
	pinZ = "sha256/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
)

const nodeDoc = `# written by install-bcd.sh
gateway_url = "https://gw.eu.example.com"
site = "fsn1"
serving_ca_spki_pin = "` + pinA + `"
join_signing_key_pin = "` + pinB + `"
join_encryption_key_pin = "` + pinZ + `"
`

const siteDoc = nodeDoc + `
[boot]
listen = "0.0.0.0:8080"
url = "http://10.20.0.2:8080"
kernel = "http://10.20.0.2:8080/ramdisk/vmlinuz"
initrd = "http://10.20.0.2:8080/ramdisk/initrd"
cmdline = "console=ttyS0,115200"
server_ip = "10.20.0.2"
proxy_dhcp = true
tftp = ":69"
tftp_root = "/srv/bcd/ipxe"
`

const fullDoc = `gateway_url = "https://gw.eu.example.com/base"
site = "site_01k5w"
serving_ca_spki_pin = "` + pinA + `"
join_signing_key_pin = "` + pinB + `"
join_encryption_key_pin = "` + pinZ + `"
data_dir = "/srv/bcd/"
socket_path = "/run/bcd/x.sock"
gateway_server_name = "gw.internal"

[boot]
listen = "[::]:8080"
url = "https://boot.example.com"
kernel = "https://boot.example.com/k"
initrd = "https://boot.example.com/i"
cmdline = 'console=ttyS0 quiet "x" \\'
server_ip = "10.0.0.1"
proxy_dhcp = false
interface = "eth0.100"
ramdisk_dir = "/srv/ramdisk"
# TFTP capacity and bounds
tftp_max_transfers = 8192
tftp_transfer_timeout = 120

[plugins]
dir = "/usr/local/lib/bcd/plugins"
cgroup = "/sys/fs/cgroup/system.slice/bcd.service/plugins"
privileged = " kata , gvisor"
memory_max = 1_073_741_824
pids_max = +512

[helper]
socket = "/run/bcd-helper/h.sock"
user = "_bcd-1"
instance_bridges = "br0,virbr1"

[update]
release_pins = "` + pinA + `,` + pinB + `"
release_threshold = 2
release_sequence = 9_223_372_036_854_775_807
slots_dir = "/usr/local/lib/bcd"
entrypoint = "/usr/bin/bcd"

[journal]
max_entries = 1

[log]
level = "debug"
format = "json"

[imds]
enabled = true
listen = "127.0.0.1:8081"

[host]
units = "nvidia-persistenced.service,fstrim.timer,getty@tty1.service,sshd.socket,multi-user.target"
command_root_sha256 = "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"
`

type docCase struct {
	name  string
	doc   string
	opts  ParseOptions
	line  int    // of the first error; 0 with msg "" for a valid document
	msg   string // a substring of that error
	multi bool   // more errors follow the first
}

var docs = []docCase{
	// Valid documents.
	{name: "empty", doc: ""},
	{name: "comments and blank lines", doc: "# a\n\n   \n\t# b\n#\n"},
	{name: "node", doc: nodeDoc},
	{name: "site agent", doc: siteDoc},
	{name: "every key", doc: fullDoc},
	{name: "CRLF", doc: strings.ReplaceAll(siteDoc, "\n", "\r\n")},
	{name: "no final newline", doc: "site = \"fsn1\"\n[log]\nlevel = \"warn\""},
	{name: "BOM", doc: "\uFEFFsite = \"fsn1\"\n"},
	{name: "comments after values", doc: "site = \"a#b\" # c\n[boot] # d\nproxy_dhcp = false# e\n[plugins]\npids_max = 5#f\n"},
	{name: "no spaces", doc: "site=\"x\"\n[log]\nlevel='info'\n"},
	{name: "spaces in header", doc: "[ boot ]\n[\tplugins\t]\n"},
	{name: "indented", doc: "  site = \"x\"\n\t[log]\n\t\tlevel\t=\t\"error\"\t\n"},
	{name: "literal string keeps backslashes", doc: "[boot]\ncmdline = 'C:\\dir \"q\" \\u0000'\n"},
	{name: "escapes", doc: `site = "\"\\\u00e9\U0001F600\u20AC"` + "\n"},
	{name: "unicode raw", doc: "site = \"zürich ☃\" # ünïcode comment\n"},
	{name: "empty sections", doc: "[plugins]\n[helper]\n[update]\n[journal]\n[log]\n[imds]\n[host]\n"},
	{name: "key before any section", doc: "site = \"x\"\n[log]\n"},
	{name: "empty list", doc: "[plugins]\nprivileged = \"\"\n"},
	{name: "zero", doc: "[update]\nrelease_sequence = 0\n"},
	{name: "plus zero", doc: "[update]\nrelease_sequence = +0\n"},
	{name: "minus zero", doc: "[update]\nrelease_sequence = -0\n"},
	{name: "int64 max", doc: "[update]\nrelease_sequence = 9223372036854775807\n"},
	{name: "http gateway in development", doc: "gateway_url = \"http://localhost:8443\"\n", opts: ParseOptions{AllowHTTP: true}},
	{name: "boot without pxe", doc: "[boot]\nlisten = \":8080\"\nproxy_dhcp = false\n"},

	// Types the subset leaves out.
	{name: "array", doc: "[plugins]\nprivileged = [\"kata\"]\n", line: 2, msg: "arrays are not supported"},
	{name: "inline table", doc: "boot = { listen = \":80\" }\n", line: 1, msg: "inline tables are not supported"},
	{name: "float", doc: "[plugins]\npids_max = 1.0\n", line: 2, msg: "floats are not supported"},
	{name: "exponent", doc: "[plugins]\npids_max = 1e3\n", line: 2, msg: "floats are not supported"},
	{name: "negative exponent", doc: "[plugins]\npids_max = -1E-3\n", line: 2, msg: "floats are not supported"},
	{name: "inf", doc: "\n[plugins]\npids_max = inf\n", line: 3, msg: "floats are not supported"},
	{name: "plus inf", doc: "[plugins]\npids_max = +inf\n", line: 2, msg: "floats are not supported"},
	{name: "nan", doc: "[plugins]\npids_max = -nan\n", line: 2, msg: "floats are not supported"},
	{name: "date", doc: "site = 1979-05-27\n", line: 1, msg: "dates and times are not supported"},
	{name: "time", doc: "site = 07:32:00\n", line: 1, msg: "dates and times are not supported"},
	{name: "datetime", doc: "site = 1979-05-27T07:32:00Z\n", line: 1, msg: "dates and times are not supported"},
	{name: "datetime with space", doc: "site = 1979-05-27 07:32:00\n", line: 1, msg: "dates and times are not supported"},
	{name: "multi-line basic", doc: "site = \"\"\"x\"\"\"\n", line: 1, msg: "multi-line strings"},
	{name: "multi-line literal", doc: "site = '''\nx\n'''\n", line: 1, msg: "multi-line strings", multi: true},
	{name: "hex", doc: "[plugins]\npids_max = 0x10\n", line: 2, msg: "hexadecimal, octal and binary"},
	{name: "octal", doc: "[plugins]\npids_max = 0o7\n", line: 2, msg: "hexadecimal, octal and binary"},
	{name: "binary", doc: "[plugins]\npids_max = 0b1\n", line: 2, msg: "hexadecimal, octal and binary"},

	// Integers.
	{name: "overflow", doc: "[update]\nrelease_sequence = 9223372036854775808\n", line: 2, msg: "does not fit in 64 bits"},
	{name: "int64 min", doc: "[update]\nrelease_sequence = -9_223_372_036_854_775_808\n", line: 2, msg: "must be at least 0"},
	{name: "underflow", doc: "[update]\nrelease_sequence = -9223372036854775809\n", line: 2, msg: "does not fit in 64 bits"},
	{name: "double underscore", doc: "[plugins]\npids_max = 1__2\n", line: 2, msg: "_ must be between digits"},
	{name: "leading underscore", doc: "[plugins]\npids_max = _1\n", line: 2, msg: "_ must be between digits"},
	{name: "trailing underscore", doc: "[plugins]\npids_max = 1_\n", line: 2, msg: "_ must be between digits"},
	{name: "sign underscore", doc: "[plugins]\npids_max = +_1\n", line: 2, msg: "_ must be between digits"},
	{name: "leading zero", doc: "[plugins]\npids_max = 01\n", line: 2, msg: "leading zeros"},
	{name: "signed leading zero", doc: "[plugins]\npids_max = +01\n", line: 2, msg: "leading zeros"},
	{name: "zero underscore", doc: "[plugins]\npids_max = 0_0\n", line: 2, msg: "leading zeros"},
	{name: "lone sign", doc: "[plugins]\npids_max = -\n", line: 2, msg: "invalid value"},
	{name: "digits and letters", doc: "[plugins]\npids_max = 12ab\n", line: 2, msg: "invalid integer 12ab"},
	{name: "comma in integer", doc: "[plugins]\npids_max = 1,2\n", line: 2, msg: "invalid integer"},

	// Keys and headers.
	{name: "dotted key", doc: "boot.listen = \":80\"\n", line: 1, msg: "dotted keys are not supported"},
	{name: "dotted key with spaces", doc: "boot . listen = \":80\"\n", line: 1, msg: "dotted keys are not supported"},
	{name: "quoted key", doc: "\"site\" = \"x\"\n", line: 1, msg: "quoted keys are not supported"},
	{name: "literal key", doc: "'site' = \"x\"\n", line: 1, msg: "quoted keys are not supported"},
	{name: "array table", doc: "[[boot]]\n", line: 1, msg: "array tables"},
	{name: "dotted section", doc: "[a.b]\nx = 1\n", line: 1, msg: "dotted section names"},
	{name: "quoted section", doc: "[\"boot\"]\n", line: 1, msg: "quoted section names"},
	{name: "empty section name", doc: "[]\n", line: 1, msg: "missing section name"},
	{name: "unclosed header", doc: "[boot\n", line: 1, msg: "missing \"]\""},
	{name: "garbage after header", doc: "[boot] x\n", line: 1, msg: "after [boot]"},
	{name: "bad char in section", doc: "[bo!ot]\n", line: 1, msg: "invalid character '!' in section name"},
	{name: "bad char in key", doc: "si$te = 1\n", line: 1, msg: "invalid character '$' in key \"si\""},
	{name: "non-ASCII key", doc: "sité = 1\n", line: 1, msg: "invalid character 'é'"},
	{name: "BOM in the middle", doc: "site = \"x\"\n\uFEFFdata_dir = \"/x\"\n", line: 2, msg: "invalid character '\\ufeff' in key"},
	{name: "unknown key", doc: "site = \"x\"\ngatway_url = \"https://x\"\n", line: 2, msg: `unknown key "gatway_url"`},
	{name: "unknown key in section", doc: "[boot]\nlisten = \":1\"\nlisen = \":1\"\n", line: 3, msg: `unknown key "lisen" in [boot]`},
	{name: "top-level key after a section", doc: "[boot]\nsite = \"x\"\n", line: 2, msg: "top-level keys go before the first section"},
	{name: "unknown section", doc: "site = \"x\"\n[bot]\nlisten = \":1\"\nfoo = 1\n", line: 2, msg: "unknown section [bot]"},
	{name: "section case", doc: "[Boot]\n", line: 1, msg: "unknown section [Boot]"},
	{name: "duplicate key", doc: "site = \"a\"\n\nsite = \"b\"\n", line: 3, msg: `duplicate key "site" (first on line 1)`},
	{name: "duplicate key in section", doc: "[log]\nlevel = \"info\"\nlevel = \"info\"\n", line: 3, msg: "duplicate key"},
	{name: "duplicate section", doc: "[log]\nlevel = \"info\"\n[boot]\n[log]\nlevel = \"warn\"\n", line: 4, msg: "duplicate section [log] (first on line 1)"},
	{name: "section redefines a key", doc: "log = 1\n[log]\n", line: 1, msg: `unknown key "log"`, multi: true},
	{name: "missing equals", doc: "site \"x\"\n", line: 1, msg: `expected "=" after key "site", found '"'`},
	{name: "bare key", doc: "site\n", line: 1, msg: `expected "=" after key "site"`},
	{name: "no value", doc: "site =\n", line: 1, msg: `missing value for key "site"`},
	{name: "no value before comment", doc: "site = # fsn1\n", line: 1, msg: "missing value"},
	{name: "no key", doc: "= \"x\"\n", line: 1, msg: `missing key before "="`},

	// Values.
	{name: "unquoted string", doc: "site = fsn1\n", line: 1, msg: "strings must be quoted"},
	{name: "capital boolean", doc: "[boot]\nproxy_dhcp = True\n", line: 2, msg: "invalid value True"},
	{name: "trailing garbage", doc: "site = \"x\" y\n", line: 1, msg: "unexpected 'y' after the value"},
	{name: "two strings", doc: "site = \"x\"\"y\"\n", line: 1, msg: "unexpected '\"' after the value"},
	{name: "two integers", doc: "[plugins]\npids_max = 1 2\n", line: 2, msg: "unexpected '2'"},
	{name: "garbage after boolean", doc: "[boot]\nproxy_dhcp = truex\n", line: 2, msg: "invalid value truex"},
	{name: "unterminated basic", doc: "site = \"fsn1\n", line: 1, msg: "unterminated string"},
	{name: "unterminated literal", doc: "site = 'fsn1\n", line: 1, msg: "unterminated string"},
	{name: "unterminated escape", doc: "site = \"fsn1\\\n", line: 1, msg: "unterminated string"},
	{name: "escaped quote does not end", doc: `site = "x\"` + "\n", line: 1, msg: "unterminated string"},
	{name: "escape x", doc: `site = "\x41"` + "\n", line: 1, msg: `invalid escape \x`},
	{name: "escape e", doc: `site = "\e"` + "\n", line: 1, msg: `invalid escape \e`},
	{name: "escape space", doc: `site = "\ "` + "\n", line: 1, msg: `invalid escape \ `},
	{name: "short u", doc: `site = "\u12"` + "\n", line: 1, msg: `\u needs 4 hexadecimal digits`},
	{name: "non-hex u", doc: `site = "\uZZZZ"` + "\n", line: 1, msg: `\u needs 4`},
	{name: "signed u", doc: `site = "\u+123"` + "\n", line: 1, msg: `\u needs 4`},
	{name: "short U", doc: `site = "\U0001F60"` + "\n", line: 1, msg: `\U needs 8`},
	{name: "surrogate", doc: `site = "\uD800"` + "\n", line: 1, msg: `\uD800 is not a Unicode scalar value`},
	{name: "U surrogate", doc: `site = "\U0000DFFF"` + "\n", line: 1, msg: "not a Unicode scalar value"},
	{name: "beyond unicode", doc: `site = "\U00110000"` + "\n", line: 1, msg: "not a Unicode scalar value"},
	{name: "far beyond unicode", doc: `site = "\UFFFFFFFF"` + "\n", line: 1, msg: "not a Unicode scalar value"},
	{name: "escaped tab reaches a value", doc: "[boot]\ncmdline = \"a\\tb\"\n", line: 2, msg: "[boot] cmdline: must not contain control characters"},
	{name: "escaped newline reaches a value", doc: "site = \"a\\nb\\b\\f\\r\"\n", line: 1, msg: "site: must not contain control characters"},
	{name: "escaped NUL reaches a value", doc: "site = \"a\\u0000\"\n", line: 1, msg: "site: must not contain control characters"},
	{name: "raw tab in a string", doc: "[boot]\ncmdline = \"a\tb\"\n", line: 2, msg: "cmdline: must not contain control characters"},
	{name: "raw tab in a literal", doc: "site = 'a\tb'\n", line: 1, msg: "site: must not contain control characters"},

	// Characters.
	{name: "control character in a string", doc: "site = \"a\x1bb\"\n", line: 1, msg: "control character U+001B"},
	{name: "control character in a comment", doc: "\n# a\x01b\n", line: 2, msg: "control character U+0001"},
	{name: "NUL", doc: "site = \"x\"\x00\n", line: 1, msg: "control character U+0000"},
	{name: "NUL first", doc: "\x00", line: 1, msg: "control character U+0000"},
	{name: "DEL", doc: "# \x7f\n", line: 1, msg: "control character U+007F"},
	{name: "C1 control", doc: "# \u0085\n", line: 1, msg: "control character U+0085"},
	{name: "form feed", doc: "site = \"x\"\f\n", line: 1, msg: "control character U+000C"},
	{name: "vertical tab", doc: "site = \"x\"\v\n", line: 1, msg: "control character U+000B"},
	{name: "lone CR", doc: "site = \"x\"\rdata_dir = \"/x\"\n", line: 1, msg: "carriage return"},
	{name: "CR at the end", doc: "site = \"x\"\r", line: 1, msg: "carriage return"},
	{name: "CR CR LF", doc: "site = \"x\"\r\r\n", line: 1, msg: "carriage return"},
	{name: "invalid UTF-8 in a comment", doc: "site = \"x\"\n# caf\xe9\n", line: 2, msg: "invalid UTF-8"},
	{name: "invalid UTF-8 in a string", doc: "site = \"\xff\"\n", line: 1, msg: "invalid UTF-8"},
	{name: "encoded surrogate", doc: "site = \"\xed\xa0\x80\"\n", line: 1, msg: "invalid UTF-8"},
	{name: "UTF-16 BOM", doc: "\xff\xfesite = \"x\"\n", line: 1, msg: "invalid UTF-8"},
	{name: "too large", doc: strings.Repeat("#\n", MaxSize/2) + "x", line: 0, msg: "larger than 65536 bytes"},

	// Wrong types and values.
	{name: "integer for string", doc: "site = 1\n", line: 1, msg: "site must be a string, not an integer"},
	{name: "string for boolean", doc: "[boot]\nproxy_dhcp = \"true\"\n", line: 2, msg: "[boot] proxy_dhcp must be a boolean, not a string"},
	{name: "string for integer", doc: "[plugins]\nmemory_max = \"1G\"\n", line: 2, msg: "must be an integer, not a string"},
	{name: "boolean for integer", doc: "[plugins]\nmemory_max = true\n", line: 2, msg: "must be an integer, not a boolean"},
	{name: "http gateway", doc: "gateway_url = \"http://gw.example.com\"\n", line: 1, msg: "gateway_url must be https://"},
	{name: "ftp gateway", doc: "gateway_url = \"ftp://gw.example.com\"\n", opts: ParseOptions{AllowHTTP: true}, line: 1, msg: "not an http:// or https:// URL"},
	{name: "gateway without host", doc: "gateway_url = \"https:///x\"\n", line: 1, msg: "has no host"},
	{name: "gateway with password", doc: "gateway_url = \"https://u:p@gw\"\n", line: 1, msg: "user name or password"},
	{name: "empty site", doc: "site = \"\"\n", line: 1, msg: "site: must not be empty"},
	{name: "pin prefix", doc: "serving_ca_spki_pin = \"sha1/AAAA\"\n", line: 1, msg: `must start with "sha256/"`},
	{name: "pin base64", doc: "join_signing_key_pin = \"sha256/not base64\"\n", line: 1, msg: "standard base64"},
	{name: "pin URL base64", doc: "join_signing_key_pin = \"sha256/ypeBEsobvcr6wjGzmiPcTaeG7_gUfE5yuYB3ha_uSLs=\"\n", line: 1, msg: "standard base64"},
	{name: "pin length", doc: "join_encryption_key_pin = \"sha256/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==\"\n", line: 1, msg: "32 bytes of a SHA-256, not 31"},
	{name: "pin unpadded", doc: "join_encryption_key_pin = \"sha256/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\"\n", line: 1, msg: "standard base64"},
	{name: "pin line break", doc: "join_encryption_key_pin = \"sha256/AAAAAAAAAAAAAAAAAAAAAA\\nAAAAAAAAAAAAAAAAAAAAA=\"\n", line: 1, msg: "without line breaks"},
	{name: "relative data_dir", doc: "data_dir = \"var/lib/bcd\"\n", line: 1, msg: "not an absolute path"},
	{name: "long socket", doc: "socket_path = \"/" + strings.Repeat("s", 120) + "\"\n", line: 1, msg: "at most 108 bytes"},
	{name: "server name", doc: "gateway_server_name = \"gw_1.example.com\"\n", line: 1, msg: "not a DNS name"},
	{name: "server name dot", doc: "gateway_server_name = \"gw.example.com.\"\n", line: 1, msg: "not a DNS name"},
	{name: "listen without port", doc: "[boot]\nlisten = \"0.0.0.0\"\n", line: 2, msg: "not host:port"},
	{name: "listen port zero", doc: "[boot]\nlisten = \":0\"\n", line: 2, msg: "no valid port"},
	{name: "listen bad host", doc: "[imds]\nlisten = \"a b:80\"\n", line: 2, msg: "neither an IP address nor a DNS name"},
	{name: "boot url scheme", doc: "[boot]\nkernel = \"tftp://x/k\"\n", line: 2, msg: "[boot] kernel"},
	{name: "server_ip v6", doc: "[boot]\nserver_ip = \"fe80::1\"\n", line: 2, msg: "not an IPv4 address"},
	{name: "server_ip mapped", doc: "[boot]\nserver_ip = \"::ffff:10.0.0.1\"\n", line: 2, msg: "not an IPv4 address"},
	{name: "long interface", doc: "[boot]\ninterface = \"enp0s31f6abcdefgh\"\n", line: 2, msg: "not a network interface name"},
	{name: "tftp_max_transfers zero", doc: "[boot]\ntftp_max_transfers = 0\n", line: 2, msg: "[boot] tftp_max_transfers: must be at least 1"},
	{name: "tftp_transfer_timeout zero", doc: "[boot]\ntftp_transfer_timeout = 0\n", line: 2, msg: "[boot] tftp_transfer_timeout: must be at least 1"},
	{name: "tftp_transfer_timeout string", doc: "[boot]\ntftp_transfer_timeout = \"5m\"\n", line: 2, msg: "must be an integer, not a string"},
	{name: "relative tftp_root", doc: "[boot]\ntftp_root = \"ipxe\"\n", line: 2, msg: "not an absolute path"},
	{name: "cgroup outside", doc: "[plugins]\ncgroup = \"/sys/fs/cgroup/../../etc\"\n", line: 2, msg: "not below /sys/fs/cgroup"},
	{name: "cgroup root", doc: "[plugins]\ncgroup = \"/sys/fs/cgroup\"\n", line: 2, msg: "not below /sys/fs/cgroup"},
	{name: "plugin name", doc: "[plugins]\nprivileged = \"kata,..\"\n", line: 2, msg: `".." is not a plugin name`},
	{name: "plugin name slash", doc: "[plugins]\nprivileged = \"a/b\"\n", line: 2, msg: "not a plugin name"},
	{name: "list empty item", doc: "[plugins]\nprivileged = \"kata,,gvisor\"\n", line: 2, msg: "empty item"},
	{name: "list trailing comma", doc: "[plugins]\nprivileged = \"kata,\"\n", line: 2, msg: "empty item"},
	{name: "list duplicate", doc: "[plugins]\nprivileged = \"kata, kata\"\n", line: 2, msg: `"kata" is listed twice`},
	{name: "memory zero", doc: "[plugins]\nmemory_max = 0\n", line: 2, msg: "[plugins] memory_max: must be at least 1"},
	{name: "negative pids", doc: "[plugins]\npids_max = -1\n", line: 2, msg: "must be at least 1"},
	{name: "helper user", doc: "[helper]\nuser = \"Bcd\"\n", line: 2, msg: "not a user name"},
	{name: "helper user digit", doc: "[helper]\nuser = \"1bcd\"\n", line: 2, msg: "not a user name"},
	{name: "bridge with slash", doc: "[helper]\ninstance_bridges = \"br0,br/1\"\n", line: 2, msg: `"br/1" is not a network interface name`},
	{name: "bridge dot", doc: "[helper]\ninstance_bridges = \".\"\n", line: 2, msg: "not a network interface name"},
	{name: "release pin", doc: "[update]\nrelease_pins = \"" + pinA + ",sha256/AAAA\"\n", line: 2, msg: "[update] release_pins: \"sha256/AAAA\""},
	{name: "threshold zero", doc: "[update]\nrelease_threshold = 0\n", line: 2, msg: "must be at least 1"},
	{name: "threshold above pins", doc: "[update]\nrelease_pins = \"" + pinA + "\"\nrelease_threshold = 2\n", line: 3, msg: "release_threshold 2 is more than the 1 release_pins"},
	{name: "negative sequence", doc: "[update]\nrelease_sequence = -1\n", line: 2, msg: "must be at least 0"},
	{name: "relative entrypoint", doc: "[update]\nentrypoint = \"bcd\"\n", line: 2, msg: "not an absolute path"},
	{name: "journal entries", doc: "[journal]\nmax_entries = 0\n", line: 2, msg: "must be at least 1"},
	{name: "log level", doc: "[log]\nlevel = \"verbose\"\n", line: 2, msg: `"verbose" is not one of debug, info, warn, error`},
	{name: "log format", doc: "[log]\nformat = \"JSON\"\n", line: 2, msg: "not one of json, text, auto"},
	{name: "imds enabled string", doc: "[imds]\nenabled = \"yes\"\n", line: 2, msg: "must be a boolean"},
	{name: "unit suffix", doc: "[host]\nunits = \"sshd.service,sshd\"\n", line: 2, msg: `"sshd" is not a systemd unit name`},
	{name: "unit bare suffix", doc: "[host]\nunits = \".service\"\n", line: 2, msg: "not a systemd unit name"},
	{name: "unit slash", doc: "[host]\nunits = \"../x.service\"\n", line: 2, msg: "not a systemd unit name"},
	{name: "root hash case", doc: "[host]\ncommand_root_sha256 = \"2D711642B726B04401627CA9FBAC32F5C8530FB1903CC4DB02258717921A4881\"\n", line: 2, msg: "64 lowercase hexadecimal"},

	// Rules between keys.
	{name: "proxy_dhcp alone", doc: "[boot]\nlisten = \":8080\"\nproxy_dhcp = true\n", line: 3, msg: "[boot] proxy_dhcp needs server_ip and url (missing server_ip and url)"},
	{name: "tftp without url", doc: "[boot]\ntftp = \":69\"\nserver_ip = \"10.0.0.1\"\n", line: 2, msg: "[boot] tftp needs server_ip and url (missing url)"},
	{name: "both without server_ip", doc: "[boot]\nurl = \"http://x\"\nproxy_dhcp = true\ntftp = \":69\"\n", line: 3, msg: "proxy_dhcp needs server_ip and url (missing server_ip)", multi: true},
	{name: "proxy_dhcp with a bad url", doc: "[boot]\nproxy_dhcp = true\nserver_ip = \"10.0.0.1\"\nurl = \"x\"\n", line: 4, msg: "[boot] url"},
}

func TestParseTable(t *testing.T) {
	if len(docs) < 60 {
		t.Fatalf("only %d documents", len(docs))
	}
	seen := map[string]bool{}
	for _, tc := range docs {
		if seen[tc.name] {
			t.Fatalf("two cases named %q", tc.name)
		}
		seen[tc.name] = true
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.doc), tc.opts)
			if tc.msg == "" {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if c == nil {
					t.Fatal("no config")
				}
				return
			}
			var list ErrorList
			if !errors.As(err, &list) || len(list) == 0 {
				t.Fatalf("got %v, want an ErrorList", err)
			}
			if c != nil {
				t.Error("a config came with errors")
			}
			if got := list[0]; got.Line != tc.line || !strings.Contains(got.Msg, tc.msg) {
				t.Errorf("first error = line %d: %q, want line %d: ...%q...", got.Line, got.Msg, tc.line, tc.msg)
			}
			if len(list) > 1 && !tc.multi {
				t.Errorf("%d errors, want 1:\n%v", len(list), list)
			}
			if len(list) == 1 && tc.multi {
				t.Errorf("one error, want more")
			}
			if !IsInvalid(err) {
				t.Error("IsInvalid = false")
			}
		})
	}
}

func TestAllErrorsSorted(t *testing.T) {
	doc := `site = "x"
bad line
[boot]
proxy_dhcp = true
listen = 80
[nope]
whatever = [1]
[log]
level = "loud"
`
	_, err := Parse([]byte(doc), ParseOptions{})
	var list ErrorList
	if !errors.As(err, &list) {
		t.Fatalf("got %v", err)
	}
	var got []int
	for _, e := range list {
		got = append(got, e.Line)
	}
	// The array on line 7 is in an unknown section, but its syntax is
	// still checked.
	if want := []int{2, 4, 5, 6, 7, 9}; !cmp.Equal(got, want) {
		t.Errorf("lines %v, want %v:\n%v", got, want, err)
	}
	want := "line 2: expected \"=\" after key \"bad\", found 'l'"
	if first := strings.SplitN(err.Error(), "\n", 2)[0]; first != want {
		t.Errorf("first line %q, want %q", first, want)
	}
}

// TestEscapes pins each escape to its rune, independently of the TOML oracle.
func TestEscapes(t *testing.T) {
	for in, want := range map[string]string{
		`\b`: "\b", `\t`: "\t", `\n`: "\n", `\f`: "\f", `\r`: "\r", `\"`: `"`, `\\`: `\`,
		`\u00E9`: "é", `\u00e9`: "é", `\u0000`: "\x00", `\U0001F600`: "😀", `\U0010FFFF`: "\U0010FFFF",
		`\uFFFD`: "\uFFFD", `a\\nb`: `a\nb`, `\'`: "",
	} {
		doc, errs := parseDocument([]byte(`k = "` + in + `"`))
		if want == "" {
			if len(errs) == 0 {
				t.Errorf("%s: accepted", in)
			}
			continue
		}
		if len(errs) > 0 {
			t.Errorf("%s: %v", in, errs)
			continue
		}
		if got := doc.tables[0].keys[0].val; got != want {
			t.Errorf("%s = %q, want %q", in, got, want)
		}
	}
}

func TestValues(t *testing.T) {
	c, err := Parse([]byte(fullDoc), ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		GatewayURL:           "https://gw.eu.example.com/base",
		Site:                 "site_01k5w",
		ServingCASPKIPin:     pinA,
		JoinSigningKeyPin:    pinB,
		JoinEncryptionKeyPin: pinZ,
		DataDir:              "/srv/bcd",
		SocketPath:           "/run/bcd/x.sock",
		GatewayServerName:    "gw.internal",
		Boot: &Boot{
			Listen: "[::]:8080", URL: "https://boot.example.com",
			Kernel: "https://boot.example.com/k", Initrd: "https://boot.example.com/i",
			Cmdline: `console=ttyS0 quiet "x" \\`, ServerIP: "10.0.0.1",
			Interface: "eth0.100", RamdiskDir: "/srv/ramdisk",
			TFTPMaxTransfers: 8192, TFTPTransferTimeout: 120,
		},
		Plugins: &Plugins{
			Dir:        "/usr/local/lib/bcd/plugins",
			Cgroup:     "/sys/fs/cgroup/system.slice/bcd.service/plugins",
			Privileged: []string{"kata", "gvisor"},
			MemoryMax:  1 << 30,
			PidsMax:    512,
		},
		Helper: &Helper{Socket: "/run/bcd-helper/h.sock", User: "_bcd-1", InstanceBridges: []string{"br0", "virbr1"}},
		Update: &Update{
			ReleasePins: []string{pinA, pinB}, ReleaseThreshold: 2, ReleaseSequence: 1<<63 - 1,
			SlotsDir: "/usr/local/lib/bcd", Entrypoint: "/usr/bin/bcd",
		},
		Journal: &Journal{Path: "/srv/bcd/journal.db", MaxEntries: 1},
		Log:     &Log{Level: "debug", Format: "json"},
		IMDS:    &IMDS{Enabled: true, Listen: "127.0.0.1:8081"},
		Host: &Host{
			Units:             []string{"nvidia-persistenced.service", "fstrim.timer", "getty@tty1.service", "sshd.socket", "multi-user.target"},
			CommandRootSHA256: "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881",
		},
	}
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestDefaults(t *testing.T) {
	c, err := Parse([]byte(nodeDoc), ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.DataDir != "/var/lib/bcd" || c.SocketPath != "/run/bcd/bcd.sock" {
		t.Errorf("data_dir %q, socket_path %q", c.DataDir, c.SocketPath)
	}
	if c.Boot != nil || c.Plugins != nil || c.Helper != nil || c.Update != nil ||
		c.Journal != nil || c.Log != nil || c.IMDS != nil || c.Host != nil {
		t.Errorf("absent sections are not nil: %+v", c)
	}
	// An absent section's defaults are still at hand.
	if diff := cmp.Diff(Journal{Path: "/var/lib/bcd/journal.db", MaxEntries: 10000}, c.JournalOrDefault()); diff != "" {
		t.Error(diff)
	}
	if diff := cmp.Diff(Log{Level: "info", Format: "auto"}, c.LogOrDefault()); diff != "" {
		t.Error(diff)
	}
	if diff := cmp.Diff(Update{ReleaseThreshold: 1, Entrypoint: "/usr/local/bin/bcd"}, c.UpdateOrDefault()); diff != "" {
		t.Error(diff)
	}
	if c.Journal != nil {
		t.Error("JournalOrDefault changed the config")
	}
	if got := c.SlotsDir(); got != "/var/lib/bcd/bin" {
		t.Errorf("SlotsDir = %q", got)
	}

	c, err = Parse([]byte(`data_dir = "/data"
[plugins]
[helper]
[update]
[journal]
[log]
[imds]
[host]
`), ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		DataDir:    "/data",
		SocketPath: "/run/bcd/bcd.sock",
		Plugins:    &Plugins{MemoryMax: 268435456, PidsMax: 128},
		Helper:     &Helper{Socket: "/run/bcd-helper/helper.sock", User: "bcd"},
		Update:     &Update{ReleaseThreshold: 1, Entrypoint: "/usr/local/bin/bcd"},
		Journal:    &Journal{Path: "/data/journal.db", MaxEntries: 10000},
		Log:        &Log{Level: "info", Format: "auto"},
		IMDS:       &IMDS{Listen: "169.254.169.254:80"},
		Host:       &Host{},
	}
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if got := c.SlotsDir(); got != "/usr/local/lib/bcd" {
		t.Errorf("SlotsDir under [helper] = %q", got)
	}
}

func TestErrorText(t *testing.T) {
	for _, tc := range []struct {
		e    Error
		want string
	}{
		{Error{File: "/etc/bcd/config.toml", Line: 3, Msg: "bad"}, "/etc/bcd/config.toml:3: bad"},
		{Error{Line: 3, Msg: "bad"}, "line 3: bad"},
		{Error{File: "c.toml", Msg: "too big"}, "c.toml: too big"},
		{Error{Msg: "too big"}, "too big"},
	} {
		if got := tc.e.Error(); got != tc.want {
			t.Errorf("%q, want %q", got, tc.want)
		}
	}
	list := ErrorList{{Line: 1, Msg: "a"}, {Line: 2, Msg: "b"}}
	if got := list.Error(); got != "line 1: a\nline 2: b" {
		t.Errorf("%q", got)
	}
	if list.Code() != "INVALID_CONFIG" || list[0].Code() != "INVALID_CONFIG" {
		t.Error("code")
	}
}

func TestValidatePin(t *testing.T) {
	for _, p := range []string{pinA, pinB, pinZ} {
		if err := ValidatePin(p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	for _, p := range []string{"", "sha256/", "SHA256/" + pinA[7:], pinA[:len(pinA)-1], pinA + "=", " " + pinA, "sha256/" + strings.Repeat("A", 43) + "B"} {
		if err := ValidatePin(p); err == nil {
			t.Errorf("%q accepted", p)
		}
	}
}
