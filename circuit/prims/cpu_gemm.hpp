// Which library runs the CPU path's f32 matmuls ("oneDNN" or "Eigen"; see CMakeLists.txt).
#pragma once

namespace kiln {

const char* cpu_gemm_library();

}  // namespace kiln
