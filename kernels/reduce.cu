// Sum reduction (loss = out.sum()): each block adds its partial sum atomically.
extern "C" __global__ void sum_f32(const float *x, float *out, unsigned long long n) {
    extern __shared__ float partial[];
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    partial[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(out, partial[0]);
}
