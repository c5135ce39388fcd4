package deploy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/better-compute/bcd/protocol"
)

// writeFiles writes the params' files into the root filesystem and the ESP. Each
// content goes to a 0600 file in the deploy's private temp directory, which debugfs
// and mtools read: no content ever reaches a command line. The root filesystem is
// checked with e2fsck -fn afterwards.
//
// links are symbolic links to make in the root filesystem (extWrite.link).
func (d *Deployer) writeFiles(ctx context.Context, in *installed, files []File, links []extWrite, tmp string, res *Result) error {
	var root, esp []extWrite
	for i, f := range files {
		src := filepath.Join(tmp, fmt.Sprintf("file-%d", i))
		if err := os.WriteFile(src, f.Content, 0o600); err != nil {
			return &Error{Reason: reasonFiles, Err: fmt.Errorf("deploy: stage %s: %w", f.Path, err)}
		}
		w := extWrite{src: src, dest: f.Path, mode: f.Mode, uid: f.UID, gid: f.GID}
		if f.FS == protocol.FSESP {
			esp = append(esp, w)
		} else {
			root = append(root, w)
		}
	}
	root = append(root, links...)
	if len(root) > 0 {
		if in.root == nil {
			return failf(reasonPartitions, "files for the root filesystem: %v", in.rootErr)
		}
		if err := in.root.write(ctx, tmp, root); err != nil {
			return failf(reasonFiles, "root partition %d: %v", in.rootPart.Number, err)
		}
		for _, w := range root {
			res.Files = append(res.Files, protocol.FSRoot+":"+w.dest)
		}
		if !d.SkipFsck {
			if err := in.root.fsck(ctx); err != nil {
				return failf(reasonFiles, "root partition %d after writing files: %v", in.rootPart.Number, err)
			}
		}
	}
	if len(esp) > 0 {
		if in.esp == nil {
			return failf(reasonPartitions, "files for the ESP: %v", in.espErr)
		}
		if err := in.esp.write(ctx, esp); err != nil {
			return failf(reasonFiles, "ESP partition %d: %v", in.espPart.Number, err)
		}
		for _, w := range esp {
			res.Files = append(res.Files, protocol.FSESP+":"+w.dest)
		}
	}
	return nil
}
