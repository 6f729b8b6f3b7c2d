/* MPI exchanges whose every byte is checked, as an MPI program over UCX would make them:
 * non-blocking sends and receives with every rank (1 B to 4 MiB, fresh buffers each time and slices
 * of one buffer, so a registration cache sees regions that overlap, outgrow each other and share
 * pages), then Alltoall, Allreduce and Bcast. Prints the first wrong byte of each bad message and
 * ends with "OK: 0 errors" or "FAIL: N errors" on rank 0; exits 1 when anything was wrong. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char Pattern(int from, int to, size_t n, int round, size_t i) {
  return (unsigned char)(from * 31 + to * 17 + n * 7 + round * 13 + i * 3 + (i >> 12));
}

static int bad, me;

static void Check(const unsigned char* got, int from, int to, size_t n, int round,
                  const char* what) {
  for (size_t i = 0; i < n; ++i) {
    if (got[i] == Pattern(from, to, n, round, i)) continue;
    printf("rank %d: %s from %d, %zu B, round %d: first wrong byte %zu is %d, not %d\n", me, what,
           from, n, round, i, got[i], Pattern(from, to, n, round, i));
    ++bad;
    return;
  }
}

/* With every rank at once: from send[p] to recv[p] of each rank p. */
static void Exchange(unsigned char** send, unsigned char** recv, size_t n, int round, int rank,
                     int size, const char* what) {
  MPI_Request* rq = calloc(2 * (size_t)size, sizeof *rq);
  for (int p = 0; p < size; ++p) {
    for (size_t i = 0; i < n; ++i) send[p][i] = Pattern(rank, p, n, round, i);
    memset(recv[p], 0xee, n);
    MPI_Irecv(recv[p], (int)n, MPI_BYTE, p, round, MPI_COMM_WORLD, &rq[p]);
  }
  for (int p = 0; p < size; ++p)
    MPI_Isend(send[p], (int)n, MPI_BYTE, p, round, MPI_COMM_WORLD, &rq[size + p]);
  MPI_Waitall(2 * size, rq, MPI_STATUSES_IGNORE);
  for (int p = 0; p < size; ++p) Check(recv[p], p, rank, n, round, what);
  free(rq);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  me = rank;
  unsigned char** send = calloc((size_t)size, sizeof *send);
  unsigned char** recv = calloc((size_t)size, sizeof *recv);
  for (int round = 0; round < 3; ++round) {
    for (size_t n = 1; n <= (4u << 20); n = n * 2 + (n & 1)) {
      for (int p = 0; p < size; ++p) {
        send[p] = malloc(n);
        recv[p] = malloc(n);
      }
      Exchange(send, recv, n, round, rank, size, "message");
      for (int p = 0; p < size; ++p) {
        free(send[p]);
        free(recv[p]);
      }
    }
    for (size_t n = 4096 + 100; n <= (2u << 20); n *= 3) {
      unsigned char* one = malloc(2 * n * (size_t)size);
      for (int p = 0; p < size; ++p) {
        send[p] = one + n * (size_t)p;
        recv[p] = one + n * (size_t)(size + p);
      }
      Exchange(send, recv, n, round + 10, rank, size, "slice");
      free(one);
    }
    for (size_t n = 1024; n <= (1u << 20); n *= 4) {
      unsigned char* s = malloc(n * (size_t)size);
      unsigned char* r = malloc(n * (size_t)size);
      for (int p = 0; p < size; ++p)
        for (size_t i = 0; i < n; ++i) s[(size_t)p * n + i] = Pattern(rank, p, n, round + 20, i);
      MPI_Alltoall(s, (int)n, MPI_BYTE, r, (int)n, MPI_BYTE, MPI_COMM_WORLD);
      for (int p = 0; p < size; ++p) Check(r + (size_t)p * n, p, rank, n, round + 20, "alltoall");
      free(s);
      free(r);
    }
    const size_t longs = 1 << 18;
    long* a = malloc(longs * sizeof *a);
    long* sum = malloc(longs * sizeof *sum);
    for (size_t i = 0; i < longs; ++i) a[i] = (long)(i + (size_t)rank);
    MPI_Allreduce(a, sum, (int)longs, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    for (size_t i = 0; i < longs; ++i)
      if (sum[i] != (long)(i * (size_t)size) + (long)size * (size - 1) / 2) {
        printf("rank %d: allreduce, first wrong element %zu\n", rank, i);
        ++bad;
        break;
      }
    free(a);
    free(sum);
    const size_t bytes = 3u << 20;
    unsigned char* c = malloc(bytes);
    for (size_t i = 0; i < bytes; ++i) c[i] = rank == 0 ? Pattern(0, 0, bytes, round, i) : 0;
    MPI_Bcast(c, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
    Check(c, 0, 0, bytes, round, "bcast");
    free(c);
  }
  int total = 0;
  MPI_Allreduce(&bad, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("%s: %d errors\n", total ? "FAIL" : "OK", total);
  MPI_Finalize();
  return total ? 1 : 0;
}
