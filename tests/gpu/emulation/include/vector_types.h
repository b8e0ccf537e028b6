#pragma once
// CUDA emulation (tests/gpu/emulation/): the vector types come with the execution model.
#include "cuda_emulation.h"
