package letterbox

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// tempPrefix marks files being written; a crash can leave them behind and
// prepare removes them.
const tempPrefix = ".tmp-"

// writeAtomic makes dir/name hold data or leave it as it was, even across a
// power cut: a reader never sees a half-written file, and once it returns
// the file survives a crash.
func writeAtomic(dir, name string, data []byte) error {
	f, err := os.CreateTemp(dir, tempPrefix+"*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	done := false
	defer func() {
		if !done {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return err
	}
	done = true
	return syncDir(dir)
}

// syncDir makes a rename or removal in dir durable. Windows cannot open a
// directory for syncing and journals the rename itself.
func syncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// removeTemps deletes what interrupted writes left in dir.
func removeTemps(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tempPrefix) {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}
