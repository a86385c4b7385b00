package bucketid

import "testing"

func TestName(t *testing.T) {
	for _, tc := range []struct {
		id   map[string]string
		want string
	}{
		{nil, "{}"},
		{map[string]string{"tenant": "acme", "api": "orders"}, `{"api":"orders","tenant":"acme"}`},
		{map[string]string{"a": `b","c":"d`}, `{"a":"b\",\"c\":\"d"}`},
	} {
		if got := Name(tc.id); got != tc.want {
			t.Errorf("Name(%v) = %s, want %s", tc.id, got, tc.want)
		}
	}
	// A value that looks like two entries names another map than the two
	// entries do.
	if Name(map[string]string{"a": `b","c":"d`}) == Name(map[string]string{"a": "b", "c": "d"}) {
		t.Error("two maps share a name")
	}
}
