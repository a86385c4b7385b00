package rls

// SetQuotaReportHook sets a function the server calls after taking each
// report, so that a test knows when a report has been divided.
func SetQuotaReportHook(s *QuotaServer, f func()) { s.onReport = f }
