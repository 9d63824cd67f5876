package x11

import (
	"bytes"
	"fmt"
	"image"
	"image/png"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/shm"
	"github.com/jezek/xgb/xproto"
	"golang.org/x/sys/unix"
)

// Capture is one capture of the screen.
type Capture struct {
	// PNG is the screen as a PNG image (8-bit RGB).
	PNG []byte
	// Width and Height are the screen's size in pixels.
	Width, Height int
}

// Capture takes the whole screen and encodes it as PNG at zlib's best
// speed. The pixels come through a shared memory segment (MIT-SHM) when
// the server offers it and shares the agent's IPC namespace, as Xvfb in
// the guest does, else in a GetImage reply.
func (d *Display) Capture() (Capture, error) {
	d.captureMu.Lock()
	defer d.captureMu.Unlock()
	pixels, err := d.capture.grab()
	if err != nil {
		return Capture{}, err
	}
	img := d.capture.rgba
	toRGBA(img.Pix, pixels)
	var buf bytes.Buffer
	buf.Grow(len(d.capture.last))
	if err := d.capture.encoder.Encode(&buf, img); err != nil {
		return Capture{}, fmt.Errorf("encoding the capture: %w", err)
	}
	d.capture.last = buf.Bytes()
	return Capture{PNG: buf.Bytes(), Width: d.width, Height: d.height}, nil
}

// capturer holds what captures reuse: the shared memory segment, the RGBA
// image and the PNG encoder's buffers.
type capturer struct {
	conn          *xgb.Conn
	root          xproto.Window
	width, height int

	seg     shm.Seg // 0 without a segment
	shmem   []byte  // the segment, attached here
	rgba    *image.RGBA
	last    []byte // the previous PNG, to size the next one's buffer
	encoder png.Encoder
}

func newCapturer(conn *xgb.Conn, root xproto.Window, width, height int) capturer {
	c := capturer{conn: conn, root: root, width: width, height: height,
		rgba:    image.NewRGBA(image.Rect(0, 0, width, height)),
		encoder: png.Encoder{CompressionLevel: png.BestSpeed, BufferPool: new(pngBuffers)}}
	c.attach()
	return c
}

// attach sets up a shared memory segment the size of the screen, attached
// both here and in the X server; without MIT-SHM, or when the server
// cannot attach it, captures use GetImage.
func (c *capturer) attach() {
	if err := shm.Init(c.conn); err != nil {
		return
	}
	size := c.width * c.height * 4
	id, err := unix.SysvShmGet(unix.IPC_PRIVATE, size, unix.IPC_CREAT|0o600)
	if err != nil {
		return
	}
	// Removed at once: the segment lives while attached, and goes with
	// the last detach, also when the agent or the server dies.
	defer unix.SysvShmCtl(id, unix.IPC_RMID, nil)
	mem, err := unix.SysvShmAttach(id, 0, 0)
	if err != nil {
		return
	}
	seg, err := shm.NewSegId(c.conn)
	if err == nil {
		err = shm.AttachChecked(c.conn, seg, uint32(id), false).Check()
	}
	if err != nil {
		unix.SysvShmDetach(mem)
		return
	}
	c.seg, c.shmem = seg, mem
}

// grab returns the screen's pixels, 4 bytes each (blue, green, red,
// unused), row after row. The slice is valid until the next grab.
func (c *capturer) grab() ([]byte, error) {
	w, h := uint16(c.width), uint16(c.height)
	if c.shmem != nil {
		if _, err := shm.GetImage(c.conn, xproto.Drawable(c.root), 0, 0, w, h, 0xffffffff,
			xproto.ImageFormatZPixmap, c.seg, 0).Reply(); err != nil {
			return nil, displayError(err)
		}
		return c.shmem, nil
	}
	reply, err := xproto.GetImage(c.conn, xproto.ImageFormatZPixmap, xproto.Drawable(c.root), 0, 0, w, h, 0xffffffff).Reply()
	if err != nil {
		return nil, displayError(err)
	}
	if len(reply.Data) < c.width*c.height*4 {
		return nil, fmt.Errorf("%w: GetImage returned %d bytes for %dx%d pixels", ErrDisplay, len(reply.Data), c.width, c.height)
	}
	return reply.Data, nil
}

// close detaches the segment.
func (c *capturer) close() {
	if c.shmem != nil {
		shm.Detach(c.conn, c.seg)
		unix.SysvShmDetach(c.shmem)
		c.shmem = nil
	}
}

// toRGBA converts pixels of 4 bytes (blue, green, red, unused) into
// opaque RGBA.
func toRGBA(dst, src []byte) {
	src = src[:len(dst)]
	for i := 0; i+3 < len(dst); i += 4 {
		s := src[i : i+4 : i+4]
		d := dst[i : i+4 : i+4]
		d[0], d[1], d[2], d[3] = s[2], s[1], s[0], 0xff
	}
}

// pngBuffers keeps the PNG encoder's buffers between captures, which one
// lock serializes.
type pngBuffers struct{ b *png.EncoderBuffer }

func (p *pngBuffers) Get() *png.EncoderBuffer  { return p.b }
func (p *pngBuffers) Put(b *png.EncoderBuffer) { p.b = b }
