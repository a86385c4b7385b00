package rls

// SetQuotaReportHook sets a function the server calls after taking each
// report, so that a test knows when a report has been divided.
func SetQuotaReportHook(s *QuotaServer, f func()) { s.onReport = f }

// ReaderError reports whether a YAML decoder's error is about bytes it
// could not read, which the parser must place on a line.
var ReaderError = readerError
