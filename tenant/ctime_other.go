//go:build !linux

package tenant

import (
	"os"
	"time"
)

// changeTime returns the zero Time: outside Linux, Watch relies on the
// file's identity, size and modification time.
func changeTime(os.FileInfo) time.Time { return time.Time{} }
