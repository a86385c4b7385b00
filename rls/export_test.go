package rls

// SetQuotaReportHook sets a function the server calls after taking each
// report, so that a test knows when a report has been divided.
func SetQuotaReportHook(s *QuotaServer, f func()) { s.onReport = f }

// ReaderError reports whether a YAML decoder's error is about bytes it
// could not read, which the parser must place on a line.
var ReaderError = readerError

// Crash stops the server as a crash would, as far as Redis and Envoys
// see: its streams end, and it takes no last round.
func Crash(s *QuotaServer) {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		close(s.done)
	})
}

// Publishable is publishable, for its test.
var Publishable = publishable
