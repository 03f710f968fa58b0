package wire

import (
	"slices"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/reprise-rl/reprise/tables"
)

// SizeItemInfo is the bytes an item takes in an ItemsResponse, its field's
// tag and length included. A caller bounding a reply sums these before it
// builds anything: an item of many slices costs about 7 bytes a slice
// here, and took ten times that as generated messages.
func SizeItemInfo(it *tables.ItemView) int {
	n := sizeItemInfo(it)
	return 1 + protowire.SizeBytes(n)
}

func sizeItemInfo(it *tables.ItemView) int {
	n := varintField(it.Key) + doubleField(it.Priority) + varintField(uint64(int64(it.TimesSampled))) +
		varintField(uint64(it.InsertedAt.UnixNano())) + varintField(uint64(it.PolicyVersion))
	for j := range it.Layout {
		n += 1 + protowire.SizeBytes(sizeColumn(&it.Layout[j], it.Chunks))
	}
	return n
}

// AppendItemsResponse appends the encoding of an ItemsResponse with an OK
// status, items and tableSize, straight from the table's items: what the
// generated code would encode for the same message
// (TestAppendItemsResponse checks), in one buffer grown once.
func AppendItemsResponse(b []byte, tableSize int64, items []tables.ItemView) []byte {
	total := 2 + varintField(uint64(tableSize))
	for i := range items {
		total += SizeItemInfo(&items[i])
	}
	b = slices.Grow(b, total)
	// The status is always set, even when empty (OK).
	b = appendTag(b, 1, protowire.BytesType)
	b = appendVarint(b, 0)
	for i := range items {
		it := &items[i]
		b = appendSubmessage(b, 2, sizeItemInfo(it))
		b = appendVarintField(b, 1, it.Key)
		b = appendDoubleField(b, 2, it.Priority)
		b = appendVarintField(b, 3, uint64(int64(it.TimesSampled)))
		b = appendVarintField(b, 4, uint64(it.InsertedAt.UnixNano()))
		for j := range it.Layout {
			b = appendSubmessage(b, 5, sizeColumn(&it.Layout[j], it.Chunks))
			b = appendColumn(b, &it.Layout[j], it.Chunks)
		}
		b = appendVarintField(b, 6, uint64(it.PolicyVersion))
	}
	return appendVarintField(b, 3, uint64(tableSize))
}
