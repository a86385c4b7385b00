package tenant

import (
	"os"
	"syscall"
	"time"
)

// changeTime returns fi's inode change time, which every write and every
// change of the modification time moves (cp -p, rsync -a and tar restore
// the modification time, not the change time).
func changeTime(fi os.FileInfo) time.Time {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return time.Unix(st.Ctim.Sec, st.Ctim.Nsec)
	}
	return time.Time{}
}
