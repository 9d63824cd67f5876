// Package enumlabel turns the values of the API's enums into the label
// values of metrics: the value's name without the prefix the enum's values
// share, in lower case (WORKSPACE_STATE_AVAILABLE is "available").
package enumlabel

import (
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// Of returns the label value of e.
func Of(e protoreflect.Enum) string {
	return Name(e.Descriptor(), e.Number())
}

// Name returns the label value of the number n of the enum d; a number the
// enum does not define is its decimal text.
func Name(d protoreflect.EnumDescriptor, n protoreflect.EnumNumber) string {
	v := d.Values().ByNumber(n)
	if v == nil {
		return protoreflect.ValueOfEnum(n).String()
	}
	return strings.ToLower(strings.TrimPrefix(string(v.Name()), prefix(d)))
}

// Known returns every number of d but zero (UNSPECIFIED), in declaration
// order.
func Known(d protoreflect.EnumDescriptor) []protoreflect.EnumNumber {
	var out []protoreflect.EnumNumber
	for i := range d.Values().Len() {
		if n := d.Values().Get(i).Number(); n != 0 {
			out = append(out, n)
		}
	}
	return out
}

// prefix is what the names of d's values share: the name of its zero value
// (X_UNSPECIFIED, by the API's lint rules) less UNSPECIFIED.
func prefix(d protoreflect.EnumDescriptor) string {
	zero := d.Values().ByNumber(0)
	if zero == nil {
		return ""
	}
	p, _ := strings.CutSuffix(string(zero.Name()), "UNSPECIFIED")
	return p
}
