// C[m,n] = A[m,k] · B[k,n], row-major, 16×16 shared-memory tiles.
#define TILE 16
extern "C" __global__ void matmul_f32(const float *A, const float *B, float *C, int m, int n, int k) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < (k + TILE - 1) / TILE; ++t) {
        int ak = t * TILE + threadIdx.x;
        int bk = t * TILE + threadIdx.y;
        As[threadIdx.y][threadIdx.x] = (row < m && ak < k) ? A[row * k + ak] : 0.0f;
        Bs[threadIdx.y][threadIdx.x] = (bk < k && col < n) ? B[bk * n + col] : 0.0f;
        __syncthreads();
        for (int j = 0; j < TILE; ++j) acc += As[threadIdx.y][j] * Bs[j][threadIdx.x];
        __syncthreads();
    }
    if (row < m && col < n) C[row * n + col] = acc;
}
