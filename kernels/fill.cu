// Fill a buffer with a value: how the engine initialises parameters and zeroes grads.
extern "C" __global__ void fill_f32(float *out, float value, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) out[i] = value;
}
