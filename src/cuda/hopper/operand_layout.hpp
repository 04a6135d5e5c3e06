// cuda-hopper: byte offsets in the forward's K-major operand tiles (Q, K as
// TMA writes them with the 128-byte swizzle), and the addresses a warp
// gives ldmatrix to read Q's register A fragments from one
// (tile_sizes.hpp q_in_registers, consumer_mainloop.cuh). Plain integer
// code for host and device, so that tests/cpu/test_hopper_operand_layout.cpp
// checks the fragment addresses against the layout's definition without a
// GPU.
//
// The layout of a K-major [rows x d] 16-bit tile: d in column blocks of
// kColBlock = 64 elements, each block [rows][128 bytes] (block b starts at
// b * rows * 128); within a 1024-byte atom of 8 rows, 16-byte chunk c of row
// r sits at chunk c ^ (r % 8) (the tile is 1024-byte aligned, so r % 8 is
// the row's position in its atom).
// Also the layout of the epilogue's per-warp chunks of O (out_chunk_offset,
// epilogue.cuh store_output_by_warp_chunks), checked by the same test.
#pragma once

#include <cstdint>

#include "cuda/fused/params.hpp"  // kChunkBytes
#include "cuda/hopper/forward/tile_sizes.hpp"

namespace gqattn::hopper {

constexpr int kSwizzleRows = kSwizzleAtomBytes / kSwizzleBytes;  // 8
constexpr int kElemsPerChunk = fused::kChunkBytes / kElemBytes;  // 8

// Byte offset of element (row, col) of a K-major tile of `rows` rows.
GQATTN_HD uint32_t k_major_offset(int row, int col, int rows) {
  const int block = col / kColBlock;
  const int chunk = col % kColBlock / kElemsPerChunk;
  return uint32_t(block * rows * kSwizzleBytes + row * kSwizzleBytes +
                  (chunk ^ (row % kSwizzleRows)) * fused::kChunkBytes +
                  col % kElemsPerChunk * kElemBytes);
}

// The ldmatrix.x4 source of `lane` for k-step kk (columns 16 kk .. 16 kk +
// 15) of rows [16 warp, 16 warp + 16) of a K-major tile of `rows` rows, as a
// byte offset from the tile. Matrix m = lane / 8 is rows 8 (m % 2) .. + 7,
// columns 16 kk + 8 (m / 2) .. + 7, and lane provides its row lane % 8; in
// that order the four matrices are the m16n8k16 A fragment (register m of
// a thread g = lane / 4, c = lane % 4 holds row g + 8 (m % 2), columns
// 16 kk + 8 (m / 2) + 2c, + 1), which is wgmma's register A fragment. The
// rows of a warp start at a multiple of 16, so the swizzle only XORs the
// chunk with lane % 8: one XOR per k-step on top of a per-lane row offset.
GQATTN_HD uint32_t a_fragment_ldmatrix_offset(int kk, int warp, int lane, int rows) {
  const int matrix = lane / 8;
  const int row_in_matrix = lane % 8;
  const int row = warp * 16 + matrix % 2 * 8 + row_in_matrix;
  constexpr int kStepsPerBlock = kColBlock / kWgmmaK;  // 4
  const int chunk = (kk % kStepsPerBlock * 2 + matrix / 2) ^ row_in_matrix;
  return uint32_t(kk / kStepsPerBlock * rows * kSwizzleBytes + row * kSwizzleBytes +
                  chunk * fused::kChunkBytes);
}

// The stmatrix.x4 destination of `lane` for the accumulator's 8-column
// blocks `block` and block + 1 of rows [16 warp, 16 warp + 16) of a K-major
// tile of `rows` rows (staged_store.cuh stage_rows, kByStmatrix), as
// a byte offset from the tile. Matrix m = lane / 8 is rows 8 (m % 2) .. + 7
// of block block + m / 2, and lane provides its row lane % 8; register m
// of a thread g = lane / 4, c = lane % 4 then holds row g + 8 (m % 2),
// columns 8 (block + m / 2) + 2c, + 1: the pair acc[block + m / 2][2 (m %
// 2)], [2 (m % 2) + 1] of the wgmma accumulator.
GQATTN_HD uint32_t accumulator_stmatrix_offset(int block, int warp, int lane, int rows) {
  const int matrix = lane / 8;
  const int row = warp * 16 + matrix % 2 * 8 + lane % 8;
  return k_major_offset(row, (block + matrix / 2) * kElemsPerChunk, rows);
}

// Byte offset of 16-byte piece `piece` (columns 8 piece .. 8 piece + 7) of
// row `row` in a warp's chunk of O, [kOutChunkRows][kOutChunkCols] 16-bit
// elements (epilogue.cuh store_output_by_warp_chunks): piece p of row r
// sits at piece p ^ ((r / 2) % 4). The accumulator layout writes, per
// 32-bit store, rows g (and g + 8) at column 2 (lane % 4) of one piece:
// rows 2j and 2j + 1 land on distinct pieces across j, odd rows 16 banks
// from even ones, so the 32 words hit 32 banks; a 16-byte read by 8 lanes
// (rows 2j, 2j + 1 whole) covers 128 contiguous bytes.
GQATTN_HD uint32_t out_chunk_offset(int row, int piece) {
  static_assert(kOutChunkCols * kElemBytes / fused::kChunkBytes == 4, "the swizzle takes 4 pieces");
  return uint32_t(row) * (kOutChunkCols * kElemBytes) +
         uint32_t(piece ^ ((row >> 1) & 3)) * fused::kChunkBytes;
}

// The stmatrix.x4 destination of `lane` for pieces `piece` and piece + 1
// of a warp's chunk of O (epilogue.cuh store_output_by_warp_chunks):
// matrix m = lane / 8 is rows 8 (m % 2) .. + 7 of piece
// piece + m / 2, lane providing row lane % 8, as in
// accumulator_stmatrix_offset. A matrix's 8 rows take 8 distinct 16-byte
// bank groups (rows r and r + 1 differ by 64 bytes, (r / 2) % 4 by the
// swizzle): no bank conflict.
GQATTN_HD uint32_t chunk_stmatrix_offset(int piece, int lane) {
  const int matrix = lane / 8;
  return out_chunk_offset(matrix % 2 * 8 + lane % 8, piece + matrix / 2);
}

}  // namespace gqattn::hopper
