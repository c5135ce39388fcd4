package deploy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"

	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/zstd"
)

// qcow2 images are converted as they stream: the served file is read once, in
// order, and every data cluster is written to its guest offset as soon as the L2
// table that maps it has been read. qemu-img lays out header, refcount table,
// refcount block, L1 and then, for each 512 MiB of guest space (64 KiB
// clusters), an L2 table followed by the clusters it maps (with -o
// preallocation=metadata, all L2 tables first), so the common layout needs no
// memory beyond a cluster. A cluster that arrives before the table that maps it
// is held in memory, up to Deployer.QCOW2Hold bytes; an image that needs more is
// refused. Compressed clusters (raw deflate, or zstd when the v3 header's
// compression_type says so) are decompressed on the way.

const (
	qcow2Magic = 0x514649fb
	// DefaultQCOW2Hold is how many bytes of clusters that arrive before the table
	// mapping them a deploy holds in memory, unless Deployer.QCOW2Hold says.
	DefaultQCOW2Hold = 64 << 20
	// qcow2HeaderPeek is how much of the stream the header is read from before
	// the disk is opened: the fixed fields of a v3 header and then some.
	qcow2HeaderPeek = 4096

	qcow2IncompatDirty       = 1 << 0
	qcow2IncompatCorrupt     = 1 << 1
	qcow2IncompatDataFile    = 1 << 2
	qcow2IncompatCompression = 1 << 3
	qcow2IncompatExtendedL2  = 1 << 4

	qcow2OffsetMask    = 0x00fffffffffffe00
	qcow2CompressedBit = 1 << 62
	qcow2ZeroFlag      = 1
	// Guards against headers that would make the tables absurd.
	qcow2MaxL1      = 32 << 20 // bytes of L1 table
	qcow2MaxVirtual = 1 << 56
)

// qcow2Header is what the converter needs of a qcow2 header.
type qcow2Header struct {
	version          uint32
	clusterBits      uint32
	size             int64 // the virtual disk's size
	l1Size           uint32
	l1Offset         int64
	refTableOffset   int64
	refTableClusters uint32
	incompat         uint64
	headerLength     uint32
	compression      byte // 0 deflate, 1 zstd
}

// qcow2Error is an image refused: reason is the protocol reason (not-implemented
// for what bcd does not convert, decompress-failed for a corrupt image).
type qcow2Error struct {
	reason string
	err    error
}

func (e *qcow2Error) Error() string { return "qcow2: " + e.err.Error() }
func (e *qcow2Error) Unwrap() error { return e.err }

func qcow2Unsupported(format string, args ...any) error {
	return &qcow2Error{reasonNotImplemented, fmt.Errorf(format, args...)}
}

func qcow2Corrupt(format string, args ...any) error {
	return &qcow2Error{reasonDecompress, fmt.Errorf(format, args...)}
}

// parseQCOW2Header reads the header from the image's first bytes and refuses
// what the streaming converter does not handle: a backing file, encryption, an
// external data file, extended L2 entries, a corrupt flag, unknown incompatible
// features.
func parseQCOW2Header(b []byte) (*qcow2Header, error) {
	if len(b) < 72 {
		return nil, qcow2Corrupt("header: truncated (%d bytes)", len(b))
	}
	be := binary.BigEndian
	if be.Uint32(b) != qcow2Magic {
		return nil, qcow2Corrupt("header: bad magic")
	}
	h := &qcow2Header{version: be.Uint32(b[4:])}
	if h.version != 2 && h.version != 3 {
		return nil, qcow2Unsupported("header: version %d (want 2 or 3)", h.version)
	}
	backingOffset, backingSize := be.Uint64(b[8:]), be.Uint32(b[16:])
	h.clusterBits = be.Uint32(b[20:])
	size := be.Uint64(b[24:])
	crypt := be.Uint32(b[32:])
	h.l1Size = be.Uint32(b[36:])
	l1Offset := be.Uint64(b[40:])
	refOffset := be.Uint64(b[48:])
	h.refTableClusters = be.Uint32(b[56:])
	h.headerLength = 72
	if h.version == 3 {
		if len(b) < 104 {
			return nil, qcow2Corrupt("header: truncated (%d bytes of a version 3 header)", len(b))
		}
		h.incompat = be.Uint64(b[72:])
		h.headerLength = be.Uint32(b[100:])
		if h.headerLength < 104 || h.headerLength%8 != 0 {
			return nil, qcow2Corrupt("header: header_length %d", h.headerLength)
		}
		if h.headerLength > 104 {
			if len(b) < 105 {
				return nil, qcow2Corrupt("header: truncated before compression_type")
			}
			h.compression = b[104]
		}
	}
	if backingOffset != 0 || backingSize != 0 {
		return nil, qcow2Unsupported("a backing file is not supported: convert the image with qemu-img convert -O qcow2 first")
	}
	if crypt != 0 {
		return nil, qcow2Unsupported("an encrypted image is not supported (crypt_method %d)", crypt)
	}
	if h.incompat&qcow2IncompatDataFile != 0 {
		return nil, qcow2Unsupported("an external data file is not supported")
	}
	if h.incompat&qcow2IncompatCorrupt != 0 {
		return nil, qcow2Corrupt("the image is marked corrupt")
	}
	if h.incompat&qcow2IncompatExtendedL2 != 0 {
		return nil, qcow2Unsupported("extended L2 entries (subclusters) are not supported")
	}
	if unknown := h.incompat &^ (qcow2IncompatDirty | qcow2IncompatCompression); unknown != 0 {
		return nil, qcow2Unsupported("unknown incompatible feature bits %#x", unknown)
	}
	if h.incompat&qcow2IncompatCompression == 0 {
		h.compression = 0
	}
	if h.compression > 1 {
		return nil, qcow2Unsupported("compression_type %d (want 0 deflate or 1 zstd)", h.compression)
	}
	if h.clusterBits < 9 || h.clusterBits > 21 {
		return nil, qcow2Corrupt("header: cluster_bits %d (want 9 to 21)", h.clusterBits)
	}
	cs := uint64(1) << h.clusterBits
	if size == 0 || size > qcow2MaxVirtual {
		return nil, qcow2Corrupt("header: virtual size %d", size)
	}
	h.size = int64(size)
	perL2 := cs / 8 * cs
	need := (size + perL2 - 1) / perL2
	if uint64(h.l1Size) < need {
		return nil, qcow2Corrupt("header: l1_size %d cannot map %d bytes", h.l1Size, size)
	}
	if uint64(h.l1Size)*8 > qcow2MaxL1 {
		return nil, qcow2Unsupported("header: an L1 table of %d entries", h.l1Size)
	}
	if l1Offset == 0 || l1Offset%cs != 0 || l1Offset > qcow2MaxVirtual {
		return nil, qcow2Corrupt("header: l1_table_offset %#x", l1Offset)
	}
	if refOffset%cs != 0 || refOffset > qcow2MaxVirtual || uint64(h.refTableClusters)*cs > qcow2MaxL1 {
		return nil, qcow2Corrupt("header: refcount table at %#x, %d clusters", refOffset, h.refTableClusters)
	}
	h.l1Offset, h.refTableOffset = int64(l1Offset), int64(refOffset)
	return h, nil
}

// Roles a host cluster can have once a table names it.
const (
	roleNone = iota
	roleL1
	roleRefTable
	roleRefBlock
	roleL2
	roleData
)

type qcow2Role struct {
	kind  int
	guest int64 // roleData: the guest offset; roleL2: the L1 index
}

// compressed is a compressed cluster not yet decoded: its bytes lie at host
// [start, end), and it decodes to the cluster at guest.
type qcow2Compressed struct {
	start, end, guest int64
}

// qcow2Converter writes a streamed qcow2 image's guest disk to a target.
type qcow2Converter struct {
	h         *qcow2Header
	cs        int64
	imageSize int64
	fileSize  int64
	holdMax   int64
	w         *guestWriter

	l1       []byte // the L1 table as read so far
	refTable []byte
	l2Left   int // L2 tables named by L1 and not yet read; -1 before L1 is read
	roles    map[int64]qcow2Role
	// held are clusters that came before any table named them, while some
	// table was still to come; window are the clusters pending compressed
	// clusters need. Both are counted against holdMax.
	held, window map[int64][]byte
	heldBytes    int64
	need         map[int64]int // host cluster -> pending compressed clusters needing it
	// claimed are the byte ranges of each window cluster that decoded compressed
	// clusters used: a cluster released from the window while tables are still
	// to come is held unless they cover it whole.
	claimed map[int64][][2]int64
	pending []qcow2Compressed
	pos     int64 // host bytes read
	eofAt   int64 // the file's length once seen, else -1

	inflate io.ReadCloser
	zstd    *zstd.Decoder
}

// writeQCOW2 converts the qcow2 stream r onto t and returns the guest image's
// first wipeSize bytes, to be written once the image is verified.
func (d *Deployer) writeQCOW2(ctx context.Context, h *qcow2Header, r io.Reader, t *target, imageSize, fileSize int64, rep *reporter, src *source) ([]byte, error) {
	holdMax := d.QCOW2Hold
	if holdMax <= 0 {
		holdMax = DefaultQCOW2Hold
	}
	w := newGuestWriter(t, imageSize, h.clusterBits, d.Writers)
	c := &qcow2Converter{h: h, cs: 1 << h.clusterBits, imageSize: imageSize, fileSize: fileSize, holdMax: holdMax, w: w,
		l2Left: -1, roles: map[int64]qcow2Role{}, held: map[int64][]byte{}, window: map[int64][]byte{}, need: map[int64]int{}, claimed: map[int64][][2]int64{}, eofAt: -1}
	defer c.close()
	err := c.run(ctx, r, func() { rep.update(w.progress(), src.received(), false) })
	if werr := w.finish(err == nil); err == nil {
		err = werr
	}
	if err != nil {
		return nil, err
	}
	return w.head, nil
}

func (c *qcow2Converter) close() {
	if c.zstd != nil {
		c.zstd.Close()
	}
}

func (c *qcow2Converter) run(ctx context.Context, r io.Reader, progress func()) error {
	cs := c.cs
	// The header cluster is known; the L1 and refcount tables' clusters too.
	c.roles[0] = qcow2Role{kind: roleNone - 1}
	l1Len := int64(c.h.l1Size) * 8
	for off := c.h.l1Offset; off < c.h.l1Offset+l1Len; off += cs {
		c.roles[off/cs] = qcow2Role{kind: roleL1}
	}
	if c.h.refTableOffset != 0 {
		for i := int64(0); i < int64(c.h.refTableClusters); i++ {
			idx := c.h.refTableOffset/cs + i
			if _, dup := c.roles[idx]; dup {
				return qcow2Corrupt("the refcount table at %#x overlaps other tables", c.h.refTableOffset)
			}
			c.roles[idx] = qcow2Role{kind: roleRefTable}
		}
	}
	for idx := int64(0); ; idx++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := c.w.err(); err != nil {
			return err
		}
		buf := make([]byte, cs)
		n, err := io.ReadFull(r, buf)
		if n == 0 && (err == io.EOF || err == io.ErrUnexpectedEOF) {
			c.eofAt = c.pos
			break
		}
		if err != nil && err != io.ErrUnexpectedEOF {
			return err
		}
		c.pos += int64(n)
		if err := c.cluster(idx, buf, n); err != nil {
			return err
		}
		progress()
		if err == io.ErrUnexpectedEOF || n < len(buf) {
			c.eofAt = c.pos
			break
		}
	}
	return c.end()
}

// cluster handles host cluster idx, of which n bytes were in the file.
func (c *qcow2Converter) cluster(idx int64, buf []byte, n int) error {
	cs := c.cs
	off := idx * cs
	role, known := c.roles[idx]
	delete(c.roles, idx)
	switch role.kind {
	case roleL1:
		start := off - c.h.l1Offset
		want := int64(c.h.l1Size) * 8
		if c.l1 == nil {
			c.l1 = make([]byte, 0, want)
		}
		c.l1 = append(c.l1, buf[:min(int64(len(buf)), want-start)]...)
		if int64(len(c.l1)) == want {
			if err := c.readL1(); err != nil {
				return err
			}
		}
	case roleRefTable:
		c.refTable = append(c.refTable, buf...)
		if int64(len(c.refTable)) == int64(c.h.refTableClusters)*cs {
			c.readRefTable()
		}
	case roleL2:
		if err := c.readL2(role.guest, buf); err != nil {
			return err
		}
	case roleData:
		if err := c.w.write(role.guest, buf); err != nil {
			return err
		}
	}
	if c.need[idx] > 0 {
		c.window[idx] = buf
		c.heldBytes += cs
	} else if !known && c.l2Left != 0 {
		// Nothing names this cluster yet, and a table that may is still to come.
		c.held[idx] = buf
		c.heldBytes += cs
	}
	if c.heldBytes > c.holdMax {
		return qcow2Unsupported("the image's layout cannot be streamed: more than %d bytes of clusters arrive before the tables that map them (rewrite it with qemu-img convert -O qcow2, or raise the bound)", c.holdMax)
	}
	return c.decodePending()
}

func (c *qcow2Converter) readL1() error {
	cs := c.cs
	idx := c.cur()
	c.l2Left = 0
	perL2 := cs / 8 * cs
	for i := 0; i < int(c.h.l1Size); i++ {
		e := binary.BigEndian.Uint64(c.l1[8*i:])
		l2 := int64(e & qcow2OffsetMask)
		if l2 == 0 {
			continue
		}
		if int64(i)*perL2 >= c.imageSize {
			continue // beyond the virtual disk: never read
		}
		if l2%cs != 0 {
			return qcow2Corrupt("L1 entry %d: L2 table offset %#x is not cluster aligned", i, l2)
		}
		hidx := l2 / cs
		if hidx <= idx {
			b, ok := c.takeHeld(hidx)
			if !ok {
				return qcow2Unsupported("the image's layout cannot be streamed: the L2 table at %#x comes before the L1 table", l2)
			}
			if err := c.readL2(int64(i), b); err != nil {
				return err
			}
			continue
		}
		if r, dup := c.roles[hidx]; dup && r.kind != roleRefBlock {
			return qcow2Corrupt("L1 entry %d: the L2 table at %#x overlaps another table", i, l2)
		}
		c.roles[hidx] = qcow2Role{kind: roleL2, guest: int64(i)}
		c.l2Left++
	}
	c.dropHeld()
	return nil
}

// readRefTable marks the refcount blocks still to come, so they are not held.
func (c *qcow2Converter) readRefTable() {
	idx := c.cur()
	for i := 0; i+8 <= len(c.refTable); i += 8 {
		off := int64(binary.BigEndian.Uint64(c.refTable[i:]) & qcow2OffsetMask)
		if off == 0 || off%c.cs != 0 || off/c.cs <= idx {
			continue
		}
		if _, dup := c.roles[off/c.cs]; !dup {
			c.roles[off/c.cs] = qcow2Role{kind: roleRefBlock}
		}
	}
}

func (c *qcow2Converter) readL2(l1Index int64, table []byte) error {
	cs := c.cs
	idx := c.cur()
	entries := cs / 8
	cbits := int64(c.h.clusterBits)
	x := 62 - (cbits - 8)
	for j := int64(0); j < entries; j++ {
		guest := (l1Index*entries + j) * cs
		if guest >= c.imageSize {
			break
		}
		e := binary.BigEndian.Uint64(table[8*j:])
		if e&qcow2CompressedBit != 0 {
			start := int64(e & (1<<x - 1))
			sectors := int64((e>>x)&(1<<(cbits-8)-1)) + 1
			end := (start &^ 511) + sectors*512
			if start == 0 || start > qcow2MaxVirtual {
				return qcow2Corrupt("L2 entry for guest %#x: compressed cluster at %#x", guest, start)
			}
			end = min(end, c.fileSize)
			if end <= start {
				return qcow2Corrupt("L2 entry for guest %#x: compressed cluster at %#x lies past the end of the file", guest, start)
			}
			if err := c.addCompressed(qcow2Compressed{start, end, guest}); err != nil {
				return err
			}
			continue
		}
		host := int64(e & qcow2OffsetMask)
		if e&qcow2ZeroFlag != 0 || host == 0 {
			continue // reads as zeros: a hole
		}
		if host%cs != 0 {
			return qcow2Corrupt("L2 entry for guest %#x: data cluster at %#x is not cluster aligned", guest, host)
		}
		hidx := host / cs
		if hidx <= idx {
			b, ok := c.takeHeld(hidx)
			if !ok {
				return qcow2Unsupported("the image's layout cannot be streamed: the data cluster at %#x comes before the L2 table that maps it, and was not held", host)
			}
			if err := c.w.write(guest, b); err != nil {
				return err
			}
			continue
		}
		if r, dup := c.roles[hidx]; dup && r.kind != roleRefBlock {
			return qcow2Corrupt("L2 entry for guest %#x: the data cluster at %#x is mapped twice or overlaps a table", guest, host)
		}
		c.roles[hidx] = qcow2Role{kind: roleData, guest: guest}
	}
	if c.l2Left > 0 {
		c.l2Left--
	}
	if c.l2Left == 0 {
		c.dropHeld()
	}
	return nil
}

// addCompressed registers a compressed cluster; its bytes that already went by
// must be held.
func (c *qcow2Converter) addCompressed(cc qcow2Compressed) error {
	idx := c.cur()
	first, last := cc.start/c.cs, (cc.end-1)/c.cs
	for h := first; h <= last && h <= idx; h++ {
		if _, ok := c.held[h]; ok {
			continue
		}
		if _, ok := c.window[h]; ok {
			continue
		}
		return qcow2Unsupported("the image's layout cannot be streamed: the compressed cluster at %#x comes before the L2 table that maps it, and was not held", cc.start)
	}
	for h := first; h <= last; h++ {
		c.need[h]++
	}
	c.pending = append(c.pending, cc)
	return nil
}

// cur is the host cluster being handled: the last one read.
func (c *qcow2Converter) cur() int64 { return (c.pos - 1) / c.cs }

// dropHeld forgets held clusters once every table has been read: nothing can
// map them any more.
func (c *qcow2Converter) dropHeld() {
	if c.l2Left != 0 {
		return
	}
	for h, b := range c.held {
		if c.need[h] > 0 {
			c.window[h] = b
		} else {
			c.heldBytes -= int64(len(b))
		}
		delete(c.held, h)
	}
}

// decodePending decodes the compressed clusters whose bytes have all come.
func (c *qcow2Converter) decodePending() error {
	if len(c.pending) == 0 {
		return nil
	}
	keep := c.pending[:0]
	var ready []qcow2Compressed
	for _, cc := range c.pending {
		if cc.end <= c.pos || c.eofAt >= 0 {
			ready = append(ready, cc)
		} else {
			keep = append(keep, cc)
		}
	}
	c.pending = keep
	sort.Slice(ready, func(i, j int) bool { return ready[i].start < ready[j].start })
	for _, cc := range ready {
		if cc.end > c.pos {
			return qcow2Corrupt("the compressed cluster at %#x lies past the end of the file", cc.start)
		}
		data := make([]byte, 0, cc.end-cc.start)
		for h := cc.start / c.cs; h <= (cc.end-1)/c.cs; h++ {
			b, ok := c.window[h]
			if !ok {
				b, ok = c.held[h]
			}
			if !ok {
				return qcow2Corrupt("internal error: the compressed cluster at %#x lost its bytes", cc.start)
			}
			lo := max(cc.start-h*c.cs, 0)
			hi := min(cc.end-h*c.cs, int64(len(b)))
			data = append(data, b[lo:hi]...)
		}
		out, used, err := c.decompress(data)
		if err != nil {
			return qcow2Corrupt("the compressed cluster at %#x (guest %#x): %v", cc.start, cc.guest, err)
		}
		if err := c.w.write(cc.guest, out); err != nil {
			return err
		}
		for h := cc.start / c.cs; h <= (cc.end-1)/c.cs; h++ {
			c.claimed[h] = append(c.claimed[h], [2]int64{cc.start, cc.start + used})
			c.need[h]--
			if c.need[h] > 0 {
				continue
			}
			delete(c.need, h)
			b, ok := c.window[h]
			if !ok {
				delete(c.claimed, h)
				continue
			}
			delete(c.window, h)
			if c.l2Left != 0 && !covered(c.claimed[h], h*c.cs, h*c.cs+int64(len(b))) {
				// Compressed clusters share host clusters: the rest of this one
				// may be mapped by a table still to come.
				c.held[h] = b
			} else {
				c.heldBytes -= int64(len(b))
			}
			delete(c.claimed, h)
		}
	}
	return nil
}

// coverSlack is the gap between two compressed clusters' ranges that still
// counts as covered: the deflate decoder stops a byte or two before the end of
// what qemu-img allocated, and no compressed cluster is that short.
const coverSlack = 8

// covered says whether the ranges cover [a, b).
func covered(ranges [][2]int64, a, b int64) bool {
	sort.Slice(ranges, func(i, j int) bool { return ranges[i][0] < ranges[j][0] })
	for _, r := range ranges {
		if r[0] > a+coverSlack {
			return false
		}
		a = max(a, r[1])
	}
	return a >= b
}

// decompress decodes one compressed cluster from data, which may run past its
// end, and says how many bytes of data it used (all of them for zstd, whose
// decoder reads ahead).
func (c *qcow2Converter) decompress(data []byte) ([]byte, int64, error) {
	out := make([]byte, c.cs)
	var r io.Reader
	br := bytes.NewReader(data)
	if c.h.compression == 1 {
		if c.zstd == nil {
			z, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(64<<20))
			if err != nil {
				return nil, 0, err
			}
			c.zstd = z
		}
		if err := c.zstd.Reset(br); err != nil {
			return nil, 0, err
		}
		r = c.zstd
	} else {
		// Raw deflate, no zlib header.
		if c.inflate == nil {
			c.inflate = flate.NewReader(br)
		} else if err := c.inflate.(flate.Resetter).Reset(br, nil); err != nil {
			return nil, 0, err
		}
		r = c.inflate
	}
	if _, err := io.ReadFull(r, out); err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil, 0, errors.New("decompresses to less than a cluster")
		}
		return nil, 0, err
	}
	used := int64(len(data)) - int64(br.Len())
	if c.h.compression == 1 {
		// The zstd decoder reads ahead: the frame's own length says.
		used = zstdFrameLen(data)
	}
	return out, used, nil
}

// zstdFrameLen is the length of the zstd frame at the start of b (RFC 8878),
// or len(b) when it cannot tell.
func zstdFrameLen(b []byte) int64 {
	if len(b) < 6 || binary.LittleEndian.Uint32(b) != 0xfd2fb528 {
		return int64(len(b))
	}
	fhd := b[4]
	n := 5
	single := fhd&0x20 != 0
	if !single {
		n++ // window descriptor
	}
	n += []int{0, 1, 2, 4}[fhd&3] // dictionary id
	fcs := []int{0, 2, 4, 8}[fhd>>6]
	if fcs == 0 && single {
		fcs = 1
	}
	n += fcs
	for n+3 <= len(b) {
		h := int(b[n]) | int(b[n+1])<<8 | int(b[n+2])<<16
		n += 3
		size := h >> 3
		if (h>>1)&3 == 1 { // RLE: one byte
			size = 1
		}
		n += size
		if h&1 != 0 {
			if fhd&4 != 0 {
				n += 4 // content checksum
			}
			if n > len(b) {
				return int64(len(b))
			}
			return int64(n)
		}
	}
	return int64(len(b))
}

// end checks that every table and cluster the image names was in the file.
func (c *qcow2Converter) end() error {
	if c.l2Left < 0 {
		return qcow2Corrupt("the L1 table at %#x lies past the end of the file (%d bytes)", c.h.l1Offset, c.pos)
	}
	if err := c.decodePending(); err != nil {
		return err
	}
	var first int64 = -1
	var what string
	for idx, r := range c.roles {
		if r.kind == roleRefBlock || r.kind == roleRefTable {
			continue
		}
		if first < 0 || idx < first {
			first = idx
			what = map[int]string{roleL2: "an L2 table", roleData: "a data cluster", roleL1: "the L1 table"}[r.kind]
		}
	}
	if first >= 0 {
		return qcow2Corrupt("%s at %#x lies past the end of the file (%d bytes)", what, first*c.cs, c.pos)
	}
	return nil
}

// guestWriter writes clusters at their guest offsets: the first wipeSize bytes
// into head, the rest in runs of adjacent clusters through a few writers.
// Guest clusters never written are holes: on a target not zeroed first, finish
// writes zeros there.
type guestWriter struct {
	t         *target
	imageSize int64
	head      []byte
	cbits     uint32
	// written has a bit per guest cluster written, in words of 64 clusters
	// (only words with a bit set: a disk's size in small clusters would not fit
	// in memory as a flat bitmap); nil on a target zeroed first.
	written map[int64]uint64

	run      []byte
	runStart int64
	free     chan []byte // run buffers back from the writers
	nbuf     int         // run buffers made so far, of cap(free)
	jobs     chan gwJob
	wg       sync.WaitGroup
	mu       sync.Mutex
	werr     error
	done     int64
}

type gwJob struct {
	buf []byte
	off int64
}

const guestRun = 4 * mib

func newGuestWriter(t *target, imageSize int64, cbits uint32, writers int) *guestWriter {
	if writers <= 0 {
		writers = 2
	}
	w := &guestWriter{t: t, imageSize: imageSize, head: alignedBuffer(int(min(int64(wipeSize), imageSize))), cbits: cbits,
		free: make(chan []byte, writers+2), jobs: make(chan gwJob), runStart: -1}
	if !t.zeroed {
		w.written = map[int64]uint64{}
	}
	for i := 0; i < writers; i++ {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			zeros := make([]byte, zeroBlock)
			for j := range w.jobs {
				if w.err() == nil {
					if _, err := t.writeSkippingZeros(j.buf, j.off, zeros); err != nil {
						w.mu.Lock()
						if w.werr == nil {
							w.werr = err
						}
						w.mu.Unlock()
					}
				}
				w.mu.Lock()
				w.done += int64(len(j.buf))
				w.mu.Unlock()
				w.free <- j.buf[:cap(j.buf)]
			}
		}()
	}
	return w
}

func (w *guestWriter) err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.werr
}

func (w *guestWriter) progress() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.done
}

// write puts a cluster's bytes at guest offset off (cut at the image's end).
func (w *guestWriter) write(off int64, p []byte) error {
	if off >= w.imageSize {
		return nil
	}
	p = p[:min(int64(len(p)), w.imageSize-off)]
	if w.written != nil {
		c := off >> w.cbits
		w.written[c/64] |= 1 << (c % 64)
	}
	if hl := int64(len(w.head)); off < hl {
		k := copy(w.head[off:], p)
		p, off = p[k:], off+int64(k)
		w.mu.Lock()
		w.done += int64(k)
		w.mu.Unlock()
	}
	for len(p) > 0 {
		if w.run != nil && (off != w.runStart+int64(len(w.run)) || len(w.run) == cap(w.run)) {
			w.flush()
		}
		if w.run == nil {
			w.run = w.buffer()
			w.runStart = off
		}
		k := min(len(p), cap(w.run)-len(w.run))
		w.run = append(w.run, p[:k]...)
		p, off = p[k:], off+int64(k)
	}
	return w.err()
}

// buffer returns an empty run buffer: a free one, or a new one while fewer than
// cap(free) exist (a small image needs only one).
func (w *guestWriter) buffer() []byte {
	select {
	case b := <-w.free:
		return b[:0]
	default:
	}
	if w.nbuf < cap(w.free) {
		w.nbuf++
		return alignedBuffer(guestRun)[:0]
	}
	return (<-w.free)[:0]
}

func (w *guestWriter) flush() {
	if w.run != nil {
		w.jobs <- gwJob{w.run, w.runStart}
		w.run = nil
	}
}

// finish waits for the writes and, when ok on a target not zeroed, zeros the
// holes.
func (w *guestWriter) finish(ok bool) error {
	if ok {
		w.flush()
	}
	close(w.jobs)
	w.wg.Wait()
	if err := w.err(); err != nil || !ok || w.written == nil {
		return err
	}
	zero := alignedBuffer(guestRun)
	cs := int64(1) << w.cbits
	hl := int64(len(w.head))
	// zeroClusters zeros guest clusters [a, b), but the head and past the end.
	zeroClusters := func(a, b int64) error {
		for lo, hi := max(a*cs, hl), min(b*cs, w.imageSize); lo < hi; {
			n := min(hi-lo, guestRun)
			if err := w.t.writeAt(zero[:n], lo); err != nil {
				return err
			}
			lo += n
		}
		return nil
	}
	words := make([]int64, 0, len(w.written))
	for k := range w.written {
		words = append(words, k)
	}
	sort.Slice(words, func(i, j int) bool { return words[i] < words[j] })
	n := (w.imageSize + cs - 1) / cs
	var next int64 // the first cluster not yet seen to
	for _, k := range words {
		bits := w.written[k]
		for b := int64(0); b < 64; b++ {
			if bits&(1<<b) == 0 {
				continue
			}
			c := k*64 + b
			if err := zeroClusters(next, c); err != nil {
				return err
			}
			next = c + 1
		}
	}
	return zeroClusters(next, n)
}

// takeHeld removes held cluster hidx and uncounts it from the bound, ok false
// when it was not held.
func (c *qcow2Converter) takeHeld(hidx int64) (b []byte, ok bool) {
	b, ok = c.held[hidx]
	if ok {
		delete(c.held, hidx)
		c.heldBytes -= int64(len(b))
	}
	return b, ok
}
