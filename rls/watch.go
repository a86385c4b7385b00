package rls

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// fingerprint sums what Watch compares: the names, sizes and modification
// times of the config's files.
func fingerprint(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return "error: " + err.Error()
	}
	var b strings.Builder
	add := func(name string, fi os.FileInfo) {
		b.WriteString(name)
		b.WriteByte(0)
		b.WriteString(strconv.FormatInt(fi.Size(), 10))
		b.WriteByte(0)
		b.WriteString(strconv.FormatInt(fi.ModTime().UnixNano(), 10))
		b.WriteByte('\n')
	}
	if !fi.IsDir() {
		add(path, fi)
		return b.String()
	}
	ents, err := os.ReadDir(path)
	if err != nil {
		return "error: " + err.Error()
	}
	for _, e := range ents {
		if info, err := os.Stat(filepath.Join(path, e.Name())); err == nil {
			add(e.Name(), info)
		}
	}
	return b.String()
}
