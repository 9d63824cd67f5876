//go:build !(linux && amd64)

package execshim

// nativeImage is empty where there is no native shim: the agent's own
// binary serves.
var nativeImage []byte
