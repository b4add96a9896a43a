package archive

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// dir is an archive in a directory: DIR/ab/abcdef01-....json, the first
// two hex digits of the id spreading the files.
type dir struct{ root string }

func openDir(root string) (*dir, error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("SAS_ARCHIVE %q: the directory must be an absolute path", root)
	}
	return &dir{root: filepath.Clean(root)}, nil
}

func (d *dir) String() string { return "directory " + d.root }

func (d *dir) path(id string) string { return filepath.Join(d.root, id[:2], id+".json") }

// Put writes the document to a temporary file in its folder, syncs it,
// renames it into place and syncs the folder: once it returns, the
// document survives a crash of the machine.
func (d *dir) Put(ctx context.Context, orderID string, doc []byte) error {
	id, err := checkID(orderID)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, err := os.Stat(d.root); err != nil {
		return fmt.Errorf("archive %s: %w", d, err)
	}
	folder := filepath.Dir(d.path(id))
	if err := os.MkdirAll(folder, 0o750); err != nil {
		return fmt.Errorf("archive %s: %w", d, err)
	}
	tmp, err := os.CreateTemp(folder, "."+id+".*")
	if err != nil {
		return fmt.Errorf("archive %s: %w", d, err)
	}
	defer os.Remove(tmp.Name()) // gone once renamed
	if _, err := tmp.Write(doc); err != nil {
		tmp.Close()
		return fmt.Errorf("archive %s: %w", d, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("archive %s: %w", d, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("archive %s: %w", d, err)
	}
	if err := os.Rename(tmp.Name(), d.path(id)); err != nil {
		return fmt.Errorf("archive %s: %w", d, err)
	}
	f, err := os.Open(folder)
	if err != nil {
		return fmt.Errorf("archive %s: %w", d, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("archive %s: %w", d, err)
	}
	return nil
}

func (d *dir) Get(_ context.Context, orderID string) ([]byte, error) {
	id, err := checkID(orderID)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(d.path(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNotArchived
	}
	if err != nil {
		return nil, fmt.Errorf("archive %s: %w", d, err)
	}
	return b, nil
}
