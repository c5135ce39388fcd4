package operator

import (
	"fmt"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/internal/cli"
)

func newImagesCmd() *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:   "images",
		Short: "The image catalog: names for an image's URL, digest, size and format (machines deploy M --image NAME)",
	}
	addAPIFlags(cmd, &af)

	var in apitype.ImageCreate
	add := &cobra.Command{
		Use:   "add NAME --url URL --sha256 H --size N --format F [--image-size N]",
		Short: "Add an image to the catalog",
		Long: `Add an image to the control plane's catalog under NAME (unique per control plane), so that
better-compute machines deploy M --image NAME installs it without repeating its URL and
digest. The fields are checked as machines deploy checks them: --url is https (or http),
--sha256 is 64 hex digits over the bytes as served, --size is the served length in bytes
(the ramdisk bounds and checks the stream with it), --format is raw, raw.gz, raw.xz,
raw.zst or qcow2, and a compressed format needs --image-size (the decompressed length).

A URL with credentials (userinfo, a presigned query) is sealed at rest like a
deployment's, and shown without them by images list and images show. A deployment
copies the entry's fields when it starts, so images delete never changes one.`,
		Args: cli.ExactArgs(1, "the image name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			in.Name = args[0]
			if in.URL == "" || in.SHA256 == "" || in.Size <= 0 || in.Format == "" {
				return cli.Usagef("images add: --url, --sha256, --size and --format are required")
			}
			in.Normalize()
			if err := in.Validate(); err != nil {
				return cli.Usagef("images add: %v", err)
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			im, err := c.AddImage(cmd.Context(), in)
			if err != nil {
				return fmt.Errorf("images add: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), im)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "image %s added: %s (%s, %d bytes, sha256 %s)\n", im.Name, im.URL, im.Format, im.Size, im.SHA256)
			return err
		},
	}
	af2 := add.Flags()
	af2.StringVar(&in.URL, "url", "", "the image's https URL")
	af2.StringVar(&in.SHA256, "sha256", "", "SHA-256 of the image as served (hex)")
	af2.Int64Var(&in.Size, "size", 0, "the image's served length in bytes")
	af2.StringVar(&in.Format, "format", "", "raw, raw.gz, raw.xz, raw.zst or qcow2")
	af2.Int64Var(&in.ImageSize, "image-size", 0, "the decompressed length (required for a compressed format)")

	list := &cobra.Command{
		Use:   "list",
		Short: "List the image catalog",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			ims, err := c.ListImages(cmd.Context())
			if err != nil {
				return fmt.Errorf("images list: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), ims)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tFORMAT\tSIZE\tIMAGE SIZE\tSHA256\tURL\tCREATED")
			for _, im := range ims {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", im.Name, im.Format, im.Size, imageSize(im), im.SHA256[:min(12, len(im.SHA256))], im.URL, stamp(im.CreatedAt))
			}
			return tw.Flush()
		},
	}
	show := &cobra.Command{
		Use:   "show NAME",
		Short: "Show a catalog entry",
		Args:  cli.ExactArgs(1, "the image name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			im, err := c.GetImage(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("images show: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), im)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			for _, kv := range [][2]string{
				{"NAME", im.Name}, {"URL", im.URL}, {"SHA256", im.SHA256}, {"SIZE", strconv.FormatInt(im.Size, 10)},
				{"FORMAT", dash(im.Format)}, {"IMAGE SIZE", imageSize(im)}, {"CREATED", stamp(im.CreatedAt)},
			} {
				fmt.Fprintf(tw, "%s:\t%s\n", kv[0], kv[1])
			}
			return tw.Flush()
		},
	}
	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Remove an image from the catalog (deployments that used it keep their copy)",
		Long: `Remove an image from the catalog. A deployment copied the entry's URL, digest, size and
format when it started, so one that runs goes on with them; machines deploy --image NAME
is refused until the name is added again.`,
		Args: cli.ExactArgs(1, "the image name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			im, err := c.DeleteImage(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("images delete: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), im)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "image %s deleted\n", im.Name)
			return err
		},
	}
	cmd.AddCommand(add, list, show, del)
	return cmd
}

func imageSize(im apitype.Image) string {
	if im.ImageSize == 0 {
		return "-"
	}
	return strconv.FormatInt(im.ImageSize, 10)
}
