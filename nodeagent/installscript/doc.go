// Package installscript generates the POSIX sh script that installs bcd node
// on a server and upgrades it (`better-compute daemon install-script`; spec
// "Installing bcd").
//
// The script holds no secret. Every value it embeds is checked against a
// narrow pattern first (a bad one is an *InputError, INVALID_INPUT naming the
// flag), and is then embedded only inside single quotes or a quoted
// here-document, so no value can end the quoting it sits in. The generator
// reads only the public half of the PKI bundle (public.json).
//
// The script decides what it sets up from the configuration it ends up with,
// not from the flags it was generated with: the plugin drop-in exactly when
// config.toml has [plugins], the self-update drop-in (40-bcd-update.conf)
// exactly when it has [update], helper mode exactly when it has [helper]. An
// upgrade run therefore keeps a node as it was.
//
// Choices the spec leaves open, made here:
//
//   - The plugin directory's pins file is /usr/local/lib/bcd/plugins/pins,
//     one line per plugin, "<sha256 hex>  <name>": the format sha256sum
//     writes, so `cd /usr/local/lib/bcd/plugins && sha256sum -c pins` checks
//     every plugin by hand. A rerun replaces the plugin's line and keeps the
//     others in their order.
//   - With --release-manifest the script writes [update] release_pins (the
//     --release-pins), release_threshold and release_sequence (the
//     manifest's sequence: the node never self-updates below the release it
//     was installed at). A config.toml that already has [update] keeps its
//     section, except that release_pins and release_threshold are added
//     when it has no release_pins, release_sequence is added when missing,
//     and release_sequence is raised, never lowered, to the manifest's.
//   - The spec's unit has ProtectSystem=strict, under which even a root bcd
//     cannot relink /usr/local/bin/bcd to its current slot or write
//     bcd-rollback.service; 40-bcd-update.conf adds ReadWritePaths for
//     /usr/local/bin and /etc/systemd/system, and nothing else.
//   - Before anything is installed, the downloaded bcd checks the new
//     config.toml (`bcd config check`), so a kept section the new version
//     refuses stops the run with the old installation intact.
//   - /etc/bcd is root's 0700 with config.toml 0600 on a root node, and
//     root:bcd 0750 with config.toml 0640 in helper mode, on every run.
//   - The version embedded in download URLs is --bcd-version as given; the
//     manifest's artifact names use the manifest's version.
package installscript
