package main

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
)

var verbImageSave = &verb{
	name:     "image save",
	summary:  "write images to an OCI archive",
	synopsis: "[flags] NAME...",
	details: `Writes one OCI archive (a tar) of the images, which den image import or
docker load reads, to FILE or to standard output (not to a terminal). Images
built or committed on the host image cannot be saved: their lower layers are
the host's own files.`,
	example: `den image save -o app.tar app:1
		den image save app:1 alpine:3.20 | ssh other den image import -`,
	run: cmdImageSave,
}

func cmdImageSave(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	output := f.String("output", "o", "FILE", "write the archive to FILE instead of standard output")
	names, err := c.atLeastOne(f, v, args, "image save needs at least one image name")
	if err != nil {
		return err
	}
	if _, tty := terminalFd(c.stdout); *output == "" && tty {
		return errors.New("refusing to write an archive to a terminal: use -o FILE or redirect standard output")
	}
	rc, err := c.client(f).SaveImages(context.Background(), names)
	if err != nil {
		return err
	}
	return c.writeArchive(*output, rc)
}

// writeArchive copies an archive to standard output ("" or "-") or to the
// file output, through a temporary file renamed at the end so that a
// failed save leaves no half-written archive there. It closes rc.
func (c *cli) writeArchive(output string, rc io.ReadCloser) error {
	defer rc.Close()
	if output == "" || output == "-" {
		_, err := io.Copy(c.stdout, rc)
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(output), "."+filepath.Base(output)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, rc); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), output)
}
