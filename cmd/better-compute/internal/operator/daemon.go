package operator

import (
	"errors"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/internal/cli"
	"github.com/better-compute/bcd/nodeagent/installscript"
)

func newDaemonCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "daemon",
		Short: "Install bcd on servers",
	}
	cmd.AddCommand(newInstallScriptCmd())
	return cmd
}

func newInstallScriptCmd() *cobra.Command {
	var r installscript.Request
	cmd := &cobra.Command{
		Use:   "install-script --pool P --site S --gateway-url URL --base-url URL --bcd-version V (--sha256 amd64=<hex>,arm64=<hex> | --release-manifest F --release-pins P1,P2) --pki DIR > install-bcd.sh",
		Short: "Print a POSIX sh script that installs (or upgrades) bcd node on a server; it holds no secret",
		Long: `Print a POSIX sh script that installs bcd node on a server, joins it and starts it,
or upgrades it in place on a server that already joined. The script holds no
secret: run it with the join token in BCD_JOIN_TOKEN (sudo -E) or on standard
input. It reads only the public half of the PKI bundle (--pki DIR/public.json).`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			r.ThresholdGiven = cmd.Flags().Changed("release-threshold")
			r.Now = releaseClock()
			script, err := installscript.Build(r)
			var input *installscript.InputError
			if errors.As(err, &input) {
				return cli.Exit(2, err)
			}
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(script)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&r.Pool, "pool", "", "pool the node joins (named in the script's header)")
	f.StringVar(&r.Site, "site", "", "site the node joins (config.toml site)")
	f.StringVar(&r.GatewayURL, "gateway-url", "", "https:// URL of the gateway (config.toml gateway_url)")
	f.StringVar(&r.BaseURL, "base-url", "", "https:// URL of the control plane's api; its path, if any, is the base path of /downloads")
	f.StringVar(&r.BCDVersion, "bcd-version", "", "bcd release to install (0.1.0)")
	f.StringVar(&r.SHA256, "sha256", "", "SHA-256 of the bare binaries: amd64=<hex>,arm64=<hex> (either may be left out)")
	f.StringVar(&r.ReleaseManifest, "release-manifest", "", "signed release manifest (manifest.json) to take the digests from")
	f.StringVar(&r.ReleasePins, "release-pins", "", "comma-separated pins of the release signing keys (with --release-manifest)")
	f.IntVar(&r.ReleaseThreshold, "release-threshold", 1, "distinct pinned keys that must have signed the manifest")
	f.StringVar(&r.Attestor, "attestor", "", "tpm: join with the machine's TPM instead of a join token")
	f.BoolVar(&r.Plugins, "plugins", false, "make a plugin node ([plugins] section, drop-in, plugin directory)")
	f.StringVar(&r.PluginsPriv, "privileged-plugins", "", "comma-separated plugins that run VMs as root ([plugins] privileged; implies --plugins)")
	f.StringVar(&r.InstallPlugins, "install-plugins", "", "comma-separated plugins to install from the release (bcx-ipmi; needs --release-manifest)")
	f.BoolVar(&r.Unprivileged, "unprivileged", false, "run bcd node as the bcd user beside a root bcd helper ([helper] section)")
	f.StringVar(&r.InstanceBridges, "instance-bridges", "", "comma-separated bridges for instances' NICs ([helper] instance_bridges; with --unprivileged)")
	f.StringVar(&r.ProxyCAFile, "proxy-ca-file", "", "PEM CA certificate(s) of a WebSocket proxy, written to /etc/bcd/websocket-proxy-ca.pem")
	f.StringVar(&r.PKIDir, "pki", "", "PKI bundle directory (only public.json is read)")
	return cmd
}
