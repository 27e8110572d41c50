package api

// ValidID reports whether s is a valid sandbox, session or command id
// (PatternID).
func ValidID(s string) bool { return patternOf(PatternID).MatchString(s) }
