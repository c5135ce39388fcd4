package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/internal/cli"
	"github.com/better-compute/bcd/internal/efiboot"
	"github.com/u-root/u-root/pkg/efivarfs"
)

// newBootOrderCmd is bcd boot-order: the UEFI boot entries as the firmware holds
// them, and keep, which bcd-boot-order.service runs at boot and at shutdown of
// an OS a deploy installed, to put the network entry the deploy recorded
// (/etc/bcd/efi-boot-first) first again after grub-install or anything else put
// itself there.
func newBootOrderCmd() *cobra.Command {
	var dir string
	var dirVars bool
	open := func() (efivarfs.EFIVar, error) {
		if dir == "" && !dirVars {
			if !efiboot.Booted() {
				return nil, errors.New("this machine did not boot through UEFI (no /sys/firmware/efi): it has no boot order to keep")
			}
		}
		return efiboot.Open(dir, dirVars)
	}
	cmd := &cobra.Command{
		Use:   "boot-order",
		Short: "Show the UEFI boot entries, network ones marked",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			v, err := open()
			if err != nil {
				return err
			}
			out, err := efiboot.Show(v)
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), out)
			return err
		},
	}
	cmd.PersistentFlags().StringVar(&dir, "efivars", "", "the efivarfs mount (default /sys/firmware/efi/efivars)")
	cmd.PersistentFlags().BoolVar(&dirVars, "efivars-dir", false, "--efivars is a plain directory in efivarfs's layout (a copy, tests), not the kernel's filesystem")
	var record string
	keep := &cobra.Command{
		Use:   "keep",
		Short: "Put the network entry a deploy recorded first in BootOrder again",
		Long: "keep reads the network boot entry a deploy put first (--record, written by the ramdisk) and, when\n" +
			"something else is first in BootOrder (grub-install, an OS update, efibootmgr), moves it back to the\n" +
			"front, the rest in the order they have: the site agent keeps deciding at each boot whether the\n" +
			"machine runs the ramdisk or this OS. It fails, changing nothing, when the entry is gone.",
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := os.ReadFile(record)
			if err != nil {
				return fmt.Errorf("--record: %w", err)
			}
			rec, raw, err := efiboot.ParseRecord(b)
			if err != nil {
				return fmt.Errorf("--record %s: %w", record, err)
			}
			v, err := open()
			if err != nil {
				return err
			}
			r, err := efiboot.Keep(v, rec, raw)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), "bcd boot-order: "+r.String())
			return err
		},
	}
	keep.Flags().StringVar(&record, "record", efiboot.RecordPath, "the network entry the deploy put first")
	cmd.AddCommand(keep)
	return cmd
}
