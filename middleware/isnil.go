package middleware

import "reflect"

// isNil reports whether v is nil, or an interface holding a nil pointer,
// map, slice, channel or function: a typed nil, such as a nil
// *tenant.Registry passed as Tables.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Chan, reflect.Func:
		return rv.IsNil()
	}
	return false
}
