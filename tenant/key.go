package tenant

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
)

// MaxKeyLen is the longest API key, in bytes, that [Table.TenantByKey]
// hashes. Longer keys are malformed and resolve to the anonymous policy
// without being hashed, so a caller cannot make each lookup expensive.
const MaxKeyLen = 256

// ErrMalformedKey is returned by [HashKey] for a key that [Table.TenantByKey]
// would never match: empty, longer than [MaxKeyLen], or holding bytes other
// than printable ASCII without spaces.
var ErrMalformedKey = errors.New("tenant: malformed API key: want 1 to 256 printable ASCII characters without spaces")

// Digest returns the SHA-256 digest of key, the form in which tables hold
// API keys. It does not allocate for keys of up to [MaxKeyLen] bytes (no
// table holds a longer one). It costs one SHA-256 over the key, which is
// why [Table.TenantByDigest] exists for callers that can hash once and look
// up many times.
func Digest(key string) [32]byte {
	if len(key) > 32 && len(key) <= MaxKeyLen {
		// Converting a string of more than 32 bytes to []byte allocates
		// (shorter ones use a buffer on the stack); a copy into a stack
		// buffer does not, and costs less than the hash.
		var buf [MaxKeyLen]byte
		n := copy(buf[:], key)
		return sha256.Sum256(buf[:n])
	}
	return sha256.Sum256([]byte(key))
}

// HashKey returns the lower-case hex SHA-256 of key: the form a config's
// keys list holds. It returns [ErrMalformedKey] for a key that lookups would
// reject anyway, so that no one configures a key that can never match.
func HashKey(key string) (string, error) {
	if !wellFormedKey(key) {
		return "", ErrMalformedKey
	}
	d := Digest(key)
	return hex.EncodeToString(d[:]), nil
}

// wellFormedKey reports whether key could be a configured API key. Keys
// reach the server as gRPC metadata, which is printable ASCII; anything else
// is noise or an attack and is not worth a hash.
func wellFormedKey(key string) bool {
	if len(key) == 0 || len(key) > MaxKeyLen {
		return false
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}

// parseDigest decodes a config's hex digest (either case).
func parseDigest(s string) ([32]byte, bool) {
	var d [32]byte
	if len(s) != 2*len(d) {
		return d, false
	}
	if _, err := hex.Decode(d[:], []byte(s)); err != nil {
		return d, false
	}
	return d, true
}
