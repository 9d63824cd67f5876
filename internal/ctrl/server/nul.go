package server

import (
	"context"
	"fmt"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// nulRefusal refuses a request any string of which holds U+0000, which no
// field of the API may (an ID, a name, a path, a command ID): PostgreSQL
// cannot store or compare such text and failed the call as internal,
// where SQLite stored it.
type nulRefusal struct{}

func (nulRefusal) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if m, ok := req.Any().(proto.Message); ok && !req.Spec().IsClient {
			if err := checkNoNUL(m.ProtoReflect(), ""); err != nil {
				return nil, err
			}
		}
		return next(ctx, req)
	}
}

func (nulRefusal) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (nulRefusal) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return next(ctx, nulCheckedConn{conn})
	}
}

// nulCheckedConn checks each message a stream receives.
type nulCheckedConn struct{ connect.StreamingHandlerConn }

func (c nulCheckedConn) Receive(msg any) error {
	if err := c.StreamingHandlerConn.Receive(msg); err != nil {
		return err
	}
	if m, ok := msg.(proto.Message); ok {
		return checkNoNUL(m.ProtoReflect(), "")
	}
	return nil
}

// checkNoNUL refuses m when a string in it, a map's keys included, holds
// U+0000, naming the field (prefix is the path to m).
func checkNoNUL(m protoreflect.Message, prefix string) error {
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		name := prefix + string(fd.Name())
		switch {
		case fd.IsList():
			l := v.List()
			for i := range l.Len() {
				if err = checkValue(fd, l.Get(i), fmt.Sprintf("%s[%d]", name, i)); err != nil {
					return false
				}
			}
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				key := k.String()
				if strings.IndexByte(key, 0) >= 0 {
					err = nulError(name + " key")
					return false
				}
				err = checkValue(fd.MapValue(), mv, name+"["+key+"]")
				return err == nil
			})
		default:
			err = checkValue(fd, v, name)
		}
		return err == nil
	})
	return err
}

func checkValue(fd protoreflect.FieldDescriptor, v protoreflect.Value, name string) error {
	switch fd.Kind() {
	case protoreflect.StringKind:
		if strings.IndexByte(v.String(), 0) >= 0 {
			return nulError(name)
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return checkNoNUL(v.Message(), name+".")
	}
	return nil
}

func nulError(field string) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s holds a NUL character (U+0000), which no field of the API may", field))
}
