// The AMX projection kernel (linear_amx.cpp), which linear_cpu.cpp's linear_bf16 hands a matmul
// to where the CPU has AMX and the inputs come in whole tiles.
#pragma once

#include <cstdint>

// whether this build has the AMX kernel and Linux lets this process use the tiles
bool amx_ready();

// out[rows, blocks * 16] = x[rows, k] W^T (+ bias), W blocked [blocks, k/2, 16, 2]; k a multiple of 32
void linear_amx(const uint16_t* x, int64_t rows, int64_t k, const uint16_t* w, int64_t blocks, const uint16_t* bias, uint16_t* out,
                int num_threads);
